"""Drive LMCache 0.5.6's own MP-server coordinator client against a coordinator.

Uses the real code from the lmcache wheel, CPU only (stub torch, stub numba):
``mp_coordinator.registrar.keep_registered`` (register, heartbeat, deregister on
cancellation), the real event wire types (``CacheEventBatch``, ``CacheEventEntry``,
``schemas.CacheEventsRequest``), and the MP server's real event reporter:
``cache_events.CacheEventSubscriber`` fed the event-bus ``Event``s the storage manager
publishes (L2 stores / deletes / accesses, L1 stores, capacity declarations), flushing
through the real ``cache_events.HttpCacheEventSink`` (``POST /events``).

Importing ``cache_events`` reaches LMCache's compiled extension ``lmcache.lmcache_native``
(links libc10.so, i.e. real torch) through the observability package, and ``cryptography``
through the L2 adapter configs. Neither is used by the reporter: both are replaced by
dummy modules below. The full MP server cannot run this way: its storage manager
(``lmcache/v1/distributed/storage_manager.py``) uses ``lmcache_native.PeriodicEventNotifier``
and the native transfer code for real.

Usage: coordinator_client.py http://127.0.0.1:PORT
Prints one JSON line per checkpoint; exits non-zero on the first failed check.
"""

import asyncio
import json
import sys
import time

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import stub_torch  # noqa: E402

stub_torch.prepare_lmcache()


def _stub_numba():
    # token_hasher imports numba.njit at module level; nothing here calls it.
    import types

    def njit(*args, **kwargs):
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]
        return lambda f: f

    mod = types.ModuleType("numba")
    mod.njit = njit
    mod.jit = njit
    sys.modules.setdefault("numba", mod)


_stub_numba()


def _stub_modules(*prefixes):
    # Dummy modules for imports the tested code never calls: any attribute is a class.
    import importlib.abc
    import importlib.machinery
    import types

    import itertools

    numbers = itertools.count(1)

    class Meta(type):
        # A dummy enum-like class: any member is a distinct int; no members to iterate.
        def __getattr__(cls, name):
            if name.startswith("__"):
                raise AttributeError(name)
            value = next(numbers)
            setattr(cls, name, value)
            return value

    class Dummy(types.ModuleType):
        def __getattr__(self, name):
            if name.startswith("__"):
                raise AttributeError(name)
            # A class, usable as a base, in annotations, and as an empty enum.
            return Meta(name, (), {"__init__": lambda self, *a, **k: None, "__members__": {}})

    class Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path, target=None):
            if any(name == p or name.startswith(p + ".") for p in prefixes):
                return importlib.machinery.ModuleSpec(name, self, is_package=True)
            return None

        def create_module(self, spec):
            mod = Dummy(spec.name)
            mod.__path__ = []
            return mod

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, Finder())


_stub_modules("lmcache.lmcache_native", "cryptography")

import httpx  # noqa: E402
from lmcache.v1.distributed.api import EncodedObjectKey, Tier  # noqa: E402
from lmcache.v1.mp_coordinator.api import (  # noqa: E402
    CacheEventBatch,
    CacheEventEntry,
    CacheEventType,
)
from lmcache.v1.mp_coordinator.schemas import (  # noqa: E402
    CacheEventsRequest,
    FleetMemoryResponse,
    InstanceMemoryStatus,
)
from lmcache.v1.mp_coordinator.registrar import keep_registered  # noqa: E402
from lmcache.v1.distributed.api import (  # noqa: E402
    CapacitySnapshot,
    ModuleMemoryCapacity,
    ObjectKey,
)
from lmcache.v1.mp_coordinator.cache_events import (  # noqa: E402
    CacheEventSubscriber,
    HttpCacheEventSink,
)
from lmcache.v1.mp_observability.event import Event, EventType  # noqa: E402


REPORTER = {}


def reporter_keys():
    return [
        ObjectKey(chunk_hash=bytes([i]) * 32, model_name="test-model", kv_rank=16777472, cache_salt="reporter")
        for i in range(3)
    ]


def drive_reporter(base):
    sink = HttpCacheEventSink(base, timeout=5.0)
    sub = CacheEventSubscriber(sink, instance_id="mp-reporter", incarnation=int(time.time()), flush_interval=3600)
    REPORTER["sub"], REPORTER["sink"] = sub, sink
    handlers = sub.get_subscriptions()

    def emit(event_type, **metadata):
        handlers[event_type](Event(event_type=event_type, timestamp=time.time(), metadata=metadata))

    keys = reporter_keys()
    emit(EventType.SM_CAPACITY_CHANGED, snapshot=CapacitySnapshot(modules=(
        ModuleMemoryCapacity(tier=Tier.L2, backend="fs", capacity_bytes=1 << 30, shared=False),
    )))
    emit(EventType.MP_TOKENS, chunk_hashes=[k.chunk_hash for k in keys],
         token_chunks=[[7, 8]] * 3, token_offsets=[0, 2, 4])
    emit(EventType.L2_KEYS_STORED, keys=keys, sizes=[4096] * 3, backend="fs")
    emit(EventType.L2_KEYS_ACCESSED, keys=keys[:1], backend="fs")
    sub.flush()  # what the eviction-loop tick does once flush_interval has passed


def drive_reporter_delete(base):
    sub, sink = REPORTER["sub"], REPORTER["sink"]
    handlers = sub.get_subscriptions()
    handlers[EventType.L2_KEYS_DELETED](Event(
        event_type=EventType.L2_KEYS_DELETED, timestamp=time.time(),
        metadata={"keys": reporter_keys()[1:], "backend": "fs"}))
    sub.shutdown()  # flushes what is pending and closes the sink, as on server shutdown


def check(cond, what):
    if not cond:
        print(json.dumps({"failed": what}), flush=True)
        sys.exit(1)
    print(json.dumps({"ok": what}), flush=True)


async def wait_for(client, url, pred, what, limit=10.0):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        body = (await client.get(url)).json()
        if pred(body):
            check(True, what)
            return body
        await asyncio.sleep(0.05)
    check(False, what)


async def main(base):
    registered = []
    async with httpx.AsyncClient(timeout=5.0) as client:
        task = asyncio.create_task(
            keep_registered(
                client,
                base,
                http_port=18080,
                instance_id="mp-interop",
                advertise_ip="127.0.0.1",
                heartbeat_interval=0.1,
                on_registered=lambda: registered.append(time.monotonic()),
            )
        )
        ids = lambda b: [i["instance_id"] for i in b["instances"]]  # noqa: E731
        await wait_for(client, f"{base}/instances", lambda b: "mp-interop" in ids(b), "registered")
        # Forget it server-side: the real client sees the heartbeat 404 and re-registers.
        await client.delete(f"{base}/instances/mp-interop")
        await wait_for(client, f"{base}/instances", lambda b: "mp-interop" in ids(b), "re-registered")
        check(len(registered) >= 2, "on_registered called again after the 404")

        key = EncodedObjectKey(chunk_hash_hex="ab" * 32, model_name="test-model", kv_rank=16777472, cache_salt="tenant")
        async def publish(batches):
            # HttpCacheEventSink.publish, verbatim in substance.
            resp = await client.post(f"{base}/events", json=CacheEventsRequest(batches=batches).model_dump(mode="json"))
            resp.raise_for_status()
            return resp.json()

        inc = int(time.time())
        store = CacheEventBatch(
            instance_id="mp-interop", incarnation=inc, seq=1, event_type=CacheEventType.STORE,
            tier=Tier.L2, backend="fs", entries=[CacheEventEntry(key=key, size_bytes=1 << 20, token_ids=[1, 2, 3], token_offset=0)],
            ts=time.time(),
        )
        check((await publish([store]))["applied"] == 1, "store batch applied")
        q = (await client.get(f"{base}/quota/tenant")).json()
        check(q["usage_gb"] == 1 / 1024, "store event moved usage")
        # A replay of the same batch is a duplicate; a delete brings usage back to 0.
        check((await publish([store]))["duplicates"] == 1, "replayed batch is a duplicate")
        delete = CacheEventBatch(
            instance_id="mp-interop", incarnation=inc, seq=2, event_type=CacheEventType.DELETE,
            tier=Tier.L2, backend="fs", entries=[CacheEventEntry(key=key)], ts=time.time(),
        )
        await publish([delete])
        q = (await client.get(f"{base}/quota/tenant")).json()
        check(q["usage_gb"] == 0.0, "delete event cleared usage")

        # The MP server's own reporter: bus events in, POST /events out through the real sink.
        # It runs on the bus's drain thread in the server; here, in a worker thread.
        await asyncio.to_thread(drive_reporter, base)
        q = (await client.get(f"{base}/quota/reporter")).json()
        check(q["usage_gb"] == 3 * 4096 / 2**30, "reporter stores moved usage")
        # Its capacity declaration (a config batch) joined to its L2 bytes, in LMCache's own
        # response models (an unknown or missing field would fail their validation).
        body = (await client.get(f"{base}/instances/mp-reporter/usage")).json()
        st = InstanceMemoryStatus.model_validate(body)
        fs = [m for m in st.modules if m.tier == Tier.L2 and m.backend == "fs"]
        check(st.declared_capacity and not st.registered and len(fs) == 1
              and fs[0].used_bytes == 3 * 4096 and fs[0].capacity_bytes == 1 << 30,
              "reporter capacity declaration and bytes in /instances/{id}/usage")
        fleet = FleetMemoryResponse.model_validate((await client.get(f"{base}/instances/usage")).json())
        check("mp-reporter" in [i.instance_id for i in fleet.instances], "fleet usage lists the reporter")
        await asyncio.to_thread(drive_reporter_delete, base)
        q = (await client.get(f"{base}/quota/reporter")).json()
        check(q["usage_gb"] == 4096 / 2**30, "reporter delete lowered usage")

        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        body = (await client.get(f"{base}/instances")).json()
        check("mp-interop" not in ids(body), "deregistered on shutdown")
    print(json.dumps({"done": True}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1].rstrip("/")))
