"""Run LMCache 0.5.6's server (``python -m lmcache.v1.server HOST PORT cpu``) CPU-only.

The server stores and returns raw bytes, but imports ``torch`` (dtype and shape constants in
its replies). This wrapper installs the project's stand-in torch (tests/interop/stub_torch.py)
and runs the module's own ``__main__`` with the same arguments.

Usage: run_lmcache_server.py HOST PORT cpu
Needs the interop venv (scripts/setup-python.sh).
"""

import os
import runpy
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "interop"))
import stub_torch  # noqa: E402

stub_torch.prepare_lmcache()

sys.argv[0] = "python -m lmcache.v1.server"
runpy.run_module("lmcache.v1.server", run_name="__main__", alter_sys=True)
