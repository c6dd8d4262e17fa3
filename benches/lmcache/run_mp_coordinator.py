"""Run LMCache 0.5.6's MP coordinator (``python -m lmcache.v1.mp_coordinator``) CPU-only.

The coordinator itself never touches a tensor, but its import chain reaches ``torch`` (for
type annotations and device detection) and ``numba`` (``token_hasher``'s ``@njit``). This
wrapper installs the project's stand-in torch (tests/interop/stub_torch.py) and a pass-through
``numba.njit``, then runs the module's own ``main()`` with the same flags.

Usage: run_mp_coordinator.py --host 127.0.0.1 --port PORT [any coordinator flag]
Needs the interop venv (scripts/setup-python.sh).
"""

import os
import runpy
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "interop"))
import stub_torch  # noqa: E402

stub_torch.prepare_lmcache()


def _njit(*args, **kwargs):
    if len(args) == 1 and callable(args[0]) and not kwargs:
        return args[0]
    return lambda f: f


_numba = types.ModuleType("numba")
_numba.njit = _njit
_numba.jit = _njit
sys.modules.setdefault("numba", _numba)

sys.argv[0] = "python -m lmcache.v1.mp_coordinator"
runpy.run_module("lmcache.v1.mp_coordinator", run_name="__main__", alter_sys=True)
