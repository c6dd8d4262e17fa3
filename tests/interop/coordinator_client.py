"""Drive LMCache 0.5.6's own MP-server coordinator client against a coordinator.

Uses the real code from the lmcache wheel, CPU only (stub torch, stub numba):
``mp_coordinator.registrar.keep_registered`` (register, heartbeat, deregister on
cancellation) and the real event wire types (``CacheEventBatch``,
``CacheEventEntry``, ``schemas.CacheEventsRequest``), posted exactly as
``cache_events.HttpCacheEventSink.publish`` does (``POST /events`` with
``CacheEventsRequest(batches=...).model_dump(mode="json")``). The sink class itself is
not imported: its module pulls in the observability stack, which needs LMCache's
compiled extension (libc10.so, i.e. real torch).

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

import httpx  # noqa: E402
from lmcache.v1.distributed.api import EncodedObjectKey, Tier  # noqa: E402
from lmcache.v1.mp_coordinator.api import (  # noqa: E402
    CacheEventBatch,
    CacheEventEntry,
    CacheEventType,
)
from lmcache.v1.mp_coordinator.schemas import CacheEventsRequest  # noqa: E402
from lmcache.v1.mp_coordinator.registrar import keep_registered  # noqa: E402


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
