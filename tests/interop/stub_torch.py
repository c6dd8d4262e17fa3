"""Stand-in ``torch`` so the real LMCache 0.5.6 Python code imports without torch.

LMCache's controller, its ``LMCacheWorker`` and ``BatchedMessageSender`` never
touch a tensor, but their import chains reach ``import torch`` (for type
annotations, dtype tables, decorators such as ``@torch.inference_mode()``) and
LMCache's compiled extensions (which link against ``libc10.so``).  This module
provides just enough of a fake to get through those imports:

* ``sys.modules["torch"]`` is a module with a proper ``ModuleSpec`` and
  ``__path__`` (so ``importlib.util.find_spec("torch")`` and
  ``import torch.x.y`` work); a meta-path finder fabricates any ``torch.*``
  submodule on demand;
* ``torch.Size = tuple``; ``torch.cuda.is_available()`` etc. are falsy;
* any other attribute is a dummy *class* (usable as a base class, in
  ``isinstance`` checks, as a dtype constant, as a decorator (factory) — a
  dummy called with a single callable returns that callable unchanged — and
  as a context manager).

``prepare_lmcache()`` additionally sets the offline env vars and, because
LMCache's CPU "device ops" come from a compiled extension that needs the real
torch, gives the ``lmcache`` package a no-op ``device_ops`` object.

Import this module and call ``prepare_lmcache()`` BEFORE importing anything
from ``lmcache``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import types

STUB_MARKER = "__kvplane_torch_stub__"


class _DummyMeta(type):
    """Metaclass: attribute access on a dummy class yields another dummy class."""

    def __getattr__(cls, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_dummy(f"{cls.__qualname__}.{name}")

    def __call__(cls, *args, **kwargs):
        # Decorator passthrough: torch.compile(fn), torch.jit.script(fn), ...
        if len(args) == 1 and not kwargs and _is_plain_callable(args[0]):
            return args[0]
        return super().__call__(*args, **kwargs)

    def __bool__(cls):  # pragma: no cover - trivial
        return True

    def __repr__(cls):
        return f"<torch-stub {cls.__qualname__}>"

    # allow "torch.Tensor | None" style annotations evaluated at runtime
    def __or__(cls, other):
        return cls

    def __ror__(cls, other):
        return cls

    def __getitem__(cls, item):
        return cls


def _is_plain_callable(obj) -> bool:
    return isinstance(obj, (types.FunctionType, types.MethodType, staticmethod,
                            classmethod, property, types.BuiltinFunctionType)) or (
        isinstance(obj, type) and not isinstance(obj, _DummyMeta))


class _Dummy(metaclass=_DummyMeta):
    """Instance of a fake torch object: falsy, callable, attribute-transparent."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _make_dummy(f"{type(self).__qualname__}.{name}")()

    def __call__(self, *args, **kwargs):
        if len(args) == 1 and not kwargs and _is_plain_callable(args[0]):
            return args[0]
        return _Dummy()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __len__(self):
        return 0

    def __int__(self):
        return 0

    def __index__(self):
        return 0

    def __float__(self):
        return 0.0

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def __repr__(self):
        return f"<torch-stub instance {type(self).__qualname__}>"


_DUMMY_CACHE: dict[str, type] = {}


def _make_dummy(qualname: str) -> type:
    cls = _DUMMY_CACHE.get(qualname)
    if cls is None:
        short = qualname.rsplit(".", 1)[-1]
        cls = _DummyMeta(short, (_Dummy,), {"__qualname__": qualname,
                                             "__module__": "torch"})
        _DUMMY_CACHE[qualname] = cls
    return cls


def _false(*_args, **_kwargs):
    return False


def _zero(*_args, **_kwargs):
    return 0


class _StubModule(types.ModuleType):
    """A fake torch (sub)module: unknown attributes become dummy classes."""

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        full = f"{self.__name__}.{name}"
        # a real submodule if one was imported, else a dummy class
        mod = sys.modules.get(full)
        if mod is not None:
            return mod
        value = _make_dummy(full)
        setattr(self, name, value)
        return value


class _StubLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return _new_module(spec.name, spec)

    def exec_module(self, module):
        _populate(module)


class _StubFinder(importlib.abc.MetaPathFinder):
    """Fabricates ``torch.<anything>`` submodules."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "torch" or fullname.startswith("torch."):
            return importlib.machinery.ModuleSpec(
                fullname, _LOADER, is_package=True)
        return None


_LOADER = _StubLoader()
_FINDER = _StubFinder()


def _new_module(name: str, spec=None) -> _StubModule:
    mod = _StubModule(name)
    mod.__spec__ = spec or importlib.machinery.ModuleSpec(
        name, _LOADER, is_package=True)
    mod.__loader__ = _LOADER
    mod.__path__ = []  # a package, so "import torch.a.b" works
    mod.__file__ = None
    setattr(mod, STUB_MARKER, True)
    return mod


def _populate(mod: _StubModule) -> None:
    name = mod.__name__
    if name == "torch":
        mod.__version__ = "0.0.0+kvplane.stub"
        mod.Size = tuple
        mod.version = types.SimpleNamespace(cuda=None, hip=None, git_version="stub",
                                            __version__=mod.__version__)
    if name in ("torch.cuda", "torch.xpu", "torch.mps", "torch.musa",
                "torch.npu", "torch.hpu"):
        mod.is_available = _false
        mod.device_count = _zero
        mod.is_initialized = _false
    if name == "torch.distributed":
        mod.is_available = _false
        mod.is_initialized = _false
    parent, _, child = name.rpartition(".")
    if parent and parent in sys.modules:
        setattr(sys.modules[parent], child, mod)


def install() -> types.ModuleType:
    """Put the stub torch in ``sys.modules`` (idempotent). Returns it."""
    existing = sys.modules.get("torch")
    if existing is not None:
        if getattr(existing, STUB_MARKER, False):
            return existing
        raise RuntimeError("a real torch is already imported; refusing to stub it")
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    torch = _new_module("torch")
    sys.modules["torch"] = torch
    _populate(torch)
    # commonly touched submodules, created eagerly and attached as attributes
    for sub in ("cuda", "distributed", "nn", "multiprocessing"):
        m = _new_module(f"torch.{sub}")
        sys.modules[m.__name__] = m
        _populate(m)
    return torch


OFFLINE_ENV = {
    "LMCACHE_TRACK_USAGE": "false",
    "DO_NOT_TRACK": "1",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}


class _NoTokenizer:
    """``transformers.AutoTokenizer`` stand-in; loading a tokenizer is an error."""

    @classmethod
    def from_pretrained(cls, *args, **kwargs):
        raise RuntimeError(
            "transformers is stubbed in the kvplane interop harness; "
            "no tokenizer can be loaded (only CacheBlend's token database needs one)")


def install_transformers_shim() -> None:
    """Provide ``transformers.AutoTokenizer`` if transformers is not installed.

    ``lmcache/v1/token_database.py`` does ``from transformers import
    AutoTokenizer`` at import time, but only the CacheBlend segment token
    database ever calls it; the controller's ``ChunkedTokenDatabase`` does
    not.  Installing transformers (>= 5.4, plus tokenizers, huggingface_hub,
    regex, safetensors, ...) just for that import is avoided.  A real
    transformers, if present, is used instead.
    """
    if "transformers" in sys.modules:
        return
    if importlib.util.find_spec("transformers") is not None:
        return
    mod = types.ModuleType("transformers")
    mod.__spec__ = importlib.machinery.ModuleSpec("transformers", None)
    mod.__version__ = "0.0.0+kvplane.stub"
    mod.AutoTokenizer = _NoTokenizer
    setattr(mod, STUB_MARKER, True)
    sys.modules["transformers"] = mod


def prepare_lmcache():
    """Offline env + stub torch + import ``lmcache`` with no-op device ops.

    Returns the imported ``lmcache`` package.
    """
    for k, v in OFFLINE_ENV.items():
        os.environ[k] = v
    install()
    install_transformers_shim()
    import lmcache  # noqa: E402  (must come after the stub)

    if not hasattr(lmcache, "device_ops"):
        # The real CPU DeviceOps needs LMCache's compiled extension, which
        # links libc10.so from torch.  Nothing on the controller/worker path
        # calls it; give a no-op so "from lmcache import device_ops" works.
        lmcache.device_ops = _Dummy()
    return lmcache


def skip_package_init(package: str) -> types.ModuleType:
    """Register ``package`` as a bare package whose ``__init__`` never runs.

    ``lmcache/v1/storage_backend/__init__.py`` eagerly imports every storage
    backend (GDS, P2P, remote, ...), which reaches LMCache's compiled
    GPU-connector extension.  ``batched_message_sender.py`` itself only needs
    the controller messages, the config and the Prometheus logger, so we make
    the package importable without its ``__init__``; submodules are then
    loaded from the real files of the installed wheel.
    """
    if package in sys.modules:
        return sys.modules[package]
    parent, _, child = package.rpartition(".")
    parent_mod = importlib.import_module(parent)
    search = [os.path.join(p, child) for p in parent_mod.__path__]
    search = [p for p in search if os.path.isdir(p)]
    if not search:
        raise ImportError(f"cannot locate package directory for {package}")
    spec = importlib.machinery.ModuleSpec(package, None, is_package=True)
    spec.submodule_search_locations = search
    mod = types.ModuleType(package)
    mod.__spec__ = spec
    mod.__path__ = search
    mod.__package__ = package
    sys.modules[package] = mod
    setattr(parent_mod, child, mod)
    return mod
