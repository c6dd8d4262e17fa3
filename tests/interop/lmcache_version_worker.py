#!/usr/bin/env python3
"""Drive ONE real ``LMCacheWorker`` of whichever LMCache version is importable.

Run with the real torch (the MP-fleet venv, scripts/setup-mp-fleet.sh) and, for an older
LMCache, ``PYTHONPATH`` pointing at that version's ``--target`` install
(scripts/setup-lmcache-versions.sh): the unmodified worker class of that version registers,
heartbeats, answers the controller's commands on its REP socket and, from 0.3.12 on, runs its
full syncs; admits and evicts go out exactly as that version's ``LocalCPUBackend`` sends them
(single ``KVAdmitMsg``/``KVEvictMsg`` through ``worker.put_msg`` up to 0.3.9, the version's own
``BatchedMessageSender`` from 0.3.10 on). Only the engine behind the worker is fake (no model,
no KV tensors). Unlike tests/interop/lmcache_worker.py (0.5.6 only, stand-in torch) it adapts
to each version by what its modules define, never by a version table of its own.

CLI: ``lmcache_version_worker.py --pull H:P --reply H:P --instance-id ID --worker-port P
[--peer-init-url H:P] [--heartbeat-time S]``

stdin commands (JSON lines; an "id" is echoed in the reply event):
  {"cmd":"admit","keys":[1,2]} / {"cmd":"evict","keys":[1]}   -> "admitted" / "evicted"
  {"cmd":"lookup","hashes":[1,2]}   -> a real BatchedP2PLookupMsg on the worker's REQ socket
                                       -> {"event":"lookup_result","layout_info":[...]}
  {"cmd":"state"}                   -> held keys, engine calls, heartbeats sent
  {"cmd":"close"}                   -> deregister + close, "closed", exit 0
Events: "ready" (with "version" and the wire features found), "registered" (0.3.12+: the
RegisterRetMsg arrived), "heartbeat_commands", "full_sync_started"/"full_sync_finished",
"engine_call" (clear, health, ...), "error".
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Optional

# The JSON protocol on stdout (imported first: it moves stdout's other writers to stderr).
from worker_protocol import FakeKey, ReportingHooks, run_driver, serve_commands
from worker_protocol import emit, jsonable as _jsonable

os.environ.setdefault("LMCACHE_TRACK_USAGE", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")

import torch  # noqa: E402  (the real one: lmcache's modules import it)

import lmcache  # noqa: E402
import lmcache.v1.cache_controller.message as M  # noqa: E402
import lmcache.v1.cache_controller.worker as worker_mod  # noqa: E402
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402

try:
    from lmcache._version import __version__ as VERSION
except ImportError:  # pragma: no cover
    VERSION = getattr(lmcache, "__version__", "unknown")

BATCHED = hasattr(M, "BatchedKVOperationMsg")
REQ_REP_REGISTER = hasattr(M, "RegisterRetMsg")
if BATCHED:
    from lmcache.v1.storage_backend.batched_message_sender import BatchedMessageSender

try:  # 0.3.12 on
    from lmcache.v1.metadata import LMCacheMetadata as Metadata
except ImportError:  # up to 0.3.11
    from lmcache.config import LMCacheEngineMetadata as Metadata

LOCAL_CPU = "LocalCPUBackend"


class FakeEngine:
    """The LMCacheEngine surface the worker uses; `clear` reports evicts like LocalCPUBackend."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.held: dict[int, None] = {}
        self.calls: list[dict[str, Any]] = []
        self.report = None  # set by the driver: (op, keys) -> None
        engine = self

        class Cpu:
            def get_keys(self):
                return [FakeKey(k) for k in engine.held_keys()]

            def __str__(self):
                return LOCAL_CPU

        self.storage_manager = SimpleNamespace(local_cpu_backend=Cpu())

    def held_keys(self) -> list[int]:
        with self._lock:
            return list(self.held)

    def _record(self, name: str, args: dict, result: Any) -> Any:
        call = {"name": name, "args": _jsonable(args), "result": result}
        with self._lock:
            self.calls.append(call)
        emit("engine_call", **call)
        return result

    def freeze(self, enabled: bool) -> None:
        emit("freeze", on=bool(enabled))

    def clear(self, locations: Optional[list[str]] = None, **kw: Any) -> int:
        with self._lock:
            gone = list(self.held)
            self.held.clear()
        if gone:
            self.report("evict", gone)
        return self._record("clear", {"locations": locations, "removed": gone}, len(gone))

    def health(self) -> int:
        return self._record("health", {}, 0)

    def lookup(self, tokens=None, **kw):
        return self._record("lookup", {"tokens": tokens}, len(tokens or []))


class ObservedWorker(ReportingHooks, worker_mod.LMCacheWorker):
    """The version's LMCacheWorker; each hook calls the real method."""

    heartbeats = 0
    stopping = False

    if REQ_REP_REGISTER:  # a coroutine answered by RegisterRetMsg from 0.3.12 on

        async def register(self):
            await super().register()
            emit("registered", heartbeat_url=self.controller_heartbeat_url)

    def put_msg(self, msg):
        # Up to 0.3.11 heartbeats go through this queue too: none may follow the
        # DeRegisterMsg, or it would register the worker again.
        if self.stopping and type(msg).__name__ == "HeartbeatMsg":
            return
        super().put_msg(msg)

    async def _send_heartbeat_msg(self, msg):
        if self.stopping:
            return M.HeartbeatRetMsg()
        ret = await super()._send_heartbeat_msg(msg)
        self.heartbeats += 1
        return ret

def build(a: argparse.Namespace):
    extra = {"full_sync_startup_delay_s": 0.2, "full_sync_status_poll_interval_s": 0.3,
             "full_sync_retry_delay_s": 0.2}
    # from_defaults() ignores the names a version does not define (lmcache_worker_ids before
    # 0.3.10); the transfer channel is only checked, never opened, by the worker.
    kwargs: dict[str, Any] = dict(
        enable_controller=True, lmcache_instance_id=a.instance_id,
        controller_pull_url=a.pull, controller_reply_url=a.reply,
        lmcache_worker_ids=[0], lmcache_worker_ports=[a.worker_port], extra_config=extra)
    if a.peer_init_url:
        host, _, port = a.peer_init_url.rpartition(":")
        kwargs.update(enable_p2p=True, p2p_host=host, p2p_init_ports=[int(port)],
                      p2p_lookup_ports=[int(port) + 1], transfer_channel="nixl")
    else:  # up to 0.3.9 the worker formats its distributed_url from these unconditionally
        kwargs.update(p2p_host=a.ip, p2p_init_ports=[0], p2p_lookup_ports=[0])
    config = LMCacheEngineConfig.from_defaults(**kwargs)
    config.lmcache_worker_heartbeat_time = a.heartbeat_time
    config.lmcache_worker_heartbeat_delay_time = 0.3
    candidates = dict(model_name="kvplane-versions-fake-model", world_size=1,
                      local_world_size=1, worker_id=0, local_worker_id=0, fmt="vllm",
                      kv_dtype=torch.float16, kv_shape=(1, 2, 256, 1, 8), use_mla=False,
                      role="worker")
    names = {f.name for f in dataclasses.fields(Metadata)}
    metadata = Metadata(**{k: v for k, v in candidates.items() if k in names})
    return config, metadata


class Driver:
    def __init__(self, a: argparse.Namespace):
        worker_mod.get_ip = lambda: a.ip  # the ip the worker reports and is dialled at
        self.config, self.metadata = build(a)
        self.engine = FakeEngine()
        self.engine.report = self.report
        self.worker = ObservedWorker(self.config, self.metadata, self.engine)
        self.sender = None
        if BATCHED:  # exactly how LocalCPUBackend builds its own
            self.sender = BatchedMessageSender(metadata=self.metadata, config=self.config,
                                               location=LOCAL_CPU, lmcache_worker=self.worker)

    def report(self, op: str, keys: list[int]) -> None:
        """Admits/evicts on the wire as this version's LocalCPUBackend sends them."""
        if self.sender is not None:
            kind = M.OpType.ADMIT if op == "admit" else M.OpType.EVICT
            for k in keys:
                self.sender.add_kv_op(op_type=kind, key=k)
            self.sender.flush()
            return
        cls = M.KVAdmitMsg if op == "admit" else M.KVEvictMsg
        for k in keys:
            self.worker.put_msg(cls(self.config.lmcache_instance_id, 0, k, LOCAL_CPU))

    def cmd_admit(self, c: dict) -> dict:
        keys = [int(k) for k in c["keys"]]
        with self.engine._lock:
            for k in keys:
                self.engine.held[k] = None
        self.report("admit", keys)
        return {"event": "admitted", "count": len(keys)}

    def cmd_evict(self, c: dict) -> dict:
        keys = [int(k) for k in c["keys"]]
        with self.engine._lock:
            for k in keys:
                self.engine.held.pop(k, None)
        self.report("evict", keys)
        return {"event": "evicted", "count": len(keys)}

    def cmd_lookup(self, c: dict) -> dict:
        msg = M.BatchedP2PLookupMsg(hashes=[int(h) for h in c["hashes"]],
                                    instance_id=self.config.lmcache_instance_id, worker_id=0)
        fut = asyncio.run_coroutine_threadsafe(self.worker.async_put_and_wait_msg(msg),
                                               self.worker.loop)
        ret = fut.result(timeout=float(c.get("timeout", 35.0)))
        if isinstance(ret, M.BatchedP2PLookupRetMsg):
            return {"event": "lookup_result", "layout_info": [list(x) for x in ret.layout_info]}
        return {"event": "lookup_result", "error": repr(ret)}

    def cmd_state(self, c: dict) -> dict:
        with self.engine._lock:
            calls = list(self.engine.calls)
        return {"event": "state", "held": self.engine.held_keys(), "calls": calls,
                "heartbeats": self.worker.heartbeats}

    def close(self) -> None:
        if self.sender is not None:
            self.sender.close()
        self.worker.stopping = True
        time.sleep(0.2)
        self.worker.deregister()
        deadline = time.monotonic() + 2.0
        time.sleep(0.05)
        while time.monotonic() < deadline and not self.worker.msg_queue.empty():
            time.sleep(0.01)
        time.sleep(0.3)  # let ZMQ's I/O thread send before close() (linger 0 from 0.3.10)
        self.worker.close()

    def run(self) -> int:
        emit("ready", version=VERSION, batched_ops=BATCHED, register_reply=REQ_REP_REGISTER,
             pid=os.getpid())

        def close(c: dict) -> dict:
            self.close()
            return {}

        return serve_commands(self, close)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pull", required=True)
    p.add_argument("--reply", required=True)
    p.add_argument("--instance-id", required=True)
    p.add_argument("--worker-port", type=int, required=True)
    p.add_argument("--peer-init-url", default=None)
    p.add_argument("--heartbeat-time", type=float, default=1.0)
    p.add_argument("--ip", default="127.0.0.1")
    return run_driver(lambda: Driver(p.parse_args()))


if __name__ == "__main__":
    sys.exit(main())
