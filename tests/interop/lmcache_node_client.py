"""Drives ``kvplane node`` with LMCache 0.5.6's own client code: its ``LMCServerConnector``
(``lmcache.v1.storage_backend.connector.lm_connector``) for PUT, GET and EXIST, and its
``lmcache.v1.protocol`` classes for HEALTH (the connector has no health call). CPU only, on
the stand-in torch; the connector's CPU allocator is replaced by a small stand-in that hands
out bytearrays (the connector only uses ``allocate(...).byte_array``).

Usage: lmcache_node_client.py HOST PORT [SPEC]
Without SPEC it runs its own checks. SPEC is JSON, ``{"put": [[KEY, SEED, LEN], ...], "get":
[[KEY, SEED, LEN], ...]}``: PUT those objects (bodies from ``body(SEED, LEN)``), then GET those
and check each against ``body(SEED, LEN)``.
Prints one JSON line per check; exits 0 when every object came back byte-identical.
"""

import asyncio
import json
import os
import socket
import sys
import types

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import stub_torch  # noqa: E402

stub_torch.prepare_lmcache()
if "sortedcontainers" not in sys.modules:
    try:
        import sortedcontainers  # noqa: F401
    except ImportError:
        stand_in = types.ModuleType("sortedcontainers")
        stand_in.SortedList = list
        stand_in.SortedDict = dict
        sys.modules["sortedcontainers"] = stand_in
# The storage_backend and connector packages' __init__ import every backend (GDS, ...) and
# LMCache's compiled GPU extension; load lm_connector's own module without them.
stub_torch.skip_package_init("lmcache.v1.storage_backend")
stub_torch.skip_package_init("lmcache.v1.storage_backend.connector")
# base_connector imports a vLLM integration helper whose chain reaches LMCache's compiled GPU
# extension (it links the real torch); nothing the connector's put/get/exists calls uses it.
_vllm_utils = stub_torch._new_module("lmcache.integration.vllm.utils")
sys.modules.setdefault("lmcache.integration.vllm.utils", _vllm_utils)
from lmcache.utils import get_size_bytes as _get_size_bytes  # noqa: E402

_vllm_utils.get_size_bytes = _get_size_bytes

import torch  # noqa: E402  (the stand-in)
from lmcache.v1.memory_management import MemoryFormat  # noqa: E402
from lmcache.v1.protocol import (  # noqa: E402
    ClientCommand,
    ClientMetaMessage,
    ServerMetaMessage,
    ServerReturnCode,
)
from lmcache.v1.storage_backend.connector.lm_connector import (  # noqa: E402
    LMCServerConnector,
)


class Shape(tuple):
    def numel(self):
        n = 1
        for d in self:
            n *= d
        return n


class Bf16:
    itemsize = 2


class Metadata:
    """What RemoteConnector.__init__ reads from LMCacheMetadata."""

    use_mla = False
    chunk_size = 16

    def get_shapes(self):
        return [Shape((2, 4, 16, 8))]

    def get_dtypes(self):
        return [Bf16()]

    def get_num_groups(self):
        return 1


class Config:
    extra_config = None
    use_layerwise = False


class Obj:
    """The parts of MemoryObj the connector uses."""

    def __init__(self, data, shape, dtype, fmt):
        self.byte_array = data
        self._shape, self._dtype, self._fmt = shape, dtype, fmt

    def get_shape(self):
        return self._shape

    def get_dtype(self):
        return self._dtype

    def get_memory_format(self):
        return self._fmt


class CpuBackend:
    """Stand-in for LocalCPUBackend: allocate() returns a buffer of the announced size."""

    config = Config()
    metadata = Metadata()

    def __init__(self):
        self.next_size = 0

    def allocate(self, shape, dtype, fmt):
        return Obj(bytearray(self.next_size), shape, dtype, fmt)


class Key:
    def __init__(self, s):
        self.s = s

    def to_string(self):
        return self.s


def health(host, port):
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(
            ClientMetaMessage(
                ClientCommand.HEALTH, Key("health"), 0, MemoryFormat(0), None, torch.Size([0])
            ).serialize()
        )
        raw = b""
        while len(raw) < ServerMetaMessage.packlength():
            chunk = s.recv(ServerMetaMessage.packlength() - len(raw))
            if not chunk:
                raise RuntimeError("closed")
            raw += chunk
        return ServerMetaMessage.deserialize(raw).code == ServerReturnCode.SUCCESS


def body(seed, n):
    x = (seed * 2654435761 + 1) & 0xFFFFFFFF
    out = bytearray(n)
    for i in range(n):
        x = (x * 1103515245 + 12345) & 0x7FFFFFFF
        out[i] = x >> 23
    return out


async def run_spec(host, port, spec):
    ok = True
    backend = CpuBackend()
    conn = LMCServerConnector(host, port, asyncio.get_running_loop(), backend)
    for key, seed, n in spec.get("put", []):
        data = body(seed, n)
        await conn.put(
            Key(key), Obj(data, torch.Size([n // 2 or 1]), torch.bfloat16, MemoryFormat(1))
        )
    # A connection is served in order: an answered EXIST means every PUT before it is stored.
    if spec.get("put"):
        ok = await conn.exists(Key(spec["put"][-1][0]))
        print(json.dumps({"check": "put", "ok": ok, "n": len(spec["put"])}), flush=True)
    for key, seed, n in spec.get("get", []):
        backend.next_size = n
        got = await conn.get(Key(key))
        passed = got is not None and bytes(got.byte_array) == bytes(body(seed, n))
        ok = ok and passed
        print(json.dumps({"check": "get", "ok": passed, "key": key}), flush=True)
    await conn.close()
    return ok


async def main(host, port):
    ok = True

    def report(check, passed, **extra):
        nonlocal ok
        ok = ok and passed
        print(json.dumps({"check": check, "ok": passed, **extra}), flush=True)

    report("health", health(host, port))
    backend = CpuBackend()
    conn = LMCServerConnector(host, port, asyncio.get_running_loop(), backend)
    objects = {
        f"interop@1@0@{i:016x}@bfloat16": body(i, n)
        for i, n in enumerate([2048, 1, 65536, 1 << 20])
    }
    for key, data in objects.items():
        await conn.put(
            Key(key), Obj(data, torch.Size([len(data) // 2 or 1]), torch.bfloat16, MemoryFormat(1))
        )
    for key, data in objects.items():
        report("exists", await conn.exists(Key(key)), key=key)
        backend.next_size = len(data)
        got = await conn.get(Key(key))
        report(
            "get",
            got is not None and bytes(got.byte_array) == bytes(data)
            and got.get_dtype() is torch.bfloat16,
            key=key,
            bytes=len(data),
        )
    report("exists_missing", not await conn.exists(Key("interop@1@0@missing@bfloat16")))
    report("get_missing", await conn.get(Key("interop@1@0@missing@bfloat16")) is None)
    await conn.close()
    return ok


if __name__ == "__main__":
    if len(sys.argv) > 3:
        passed = asyncio.run(run_spec(sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])))
    else:
        passed = asyncio.run(main(sys.argv[1], int(sys.argv[2])))
    print(json.dumps({"check": "all", "ok": passed}), flush=True)
    sys.exit(0 if passed else 1)
