#!/usr/bin/env python3
"""Drive ONE real LMCache 0.5.6 ``LMCacheWorker`` with a fake engine.

The worker is the unmodified ``lmcache.v1.cache_controller.worker.LMCacheWorker``
(registration, PUSH loop, REP loop, heartbeat, full sync), fed KV admit/evict
events through LMCache's own ``BatchedMessageSender``; only the engine behind it
is fake (no GPU, no torch: see stub_torch.py).  It is controlled by JSON lines
on stdin and reports JSON lines on stdout (one object per line, flushed), so a
test in any language can drive it.  LMCache's logs go to stderr.

CLI::

    lmcache_worker.py --pull HOST:PORT --reply HOST:PORT --instance-id ID
        [--worker-id N] [--worker-port P] [--peer-init-url HOST:PORT]
        [--heartbeat-time S] [--heartbeat-delay S] [--ip 127.0.0.1]
        [--full-sync-startup-delay S] [--full-sync-poll-interval S]
        [--recv-timeout-ms MS] [--send-timeout-ms MS]
        [--extra-config JSON]

stdin commands (any command may carry an "id", echoed in its reply event):

  {"cmd":"admit","keys":[1,2],"location":"LocalCPUBackend"}
        -> keys go through the location's BatchedMessageSender (flushed);
           added to the fake engine's held set.  Reply: {"event":"admitted",...}
  {"cmd":"evict","keys":[1],"location":"LocalCPUBackend"}
        -> same, OpType.EVICT; removed from the held set. Reply "evicted".
  {"cmd":"lookup","hashes":[1,2,3]}
        -> a real BatchedP2PLookupMsg through worker.async_put_and_wait_msg
           (the DEALER path P2PBackend.batched_async_contains uses).
           Reply: {"event":"lookup_result","layout_info":[[inst,loc,n,url]]}
  {"cmd":"state"}     -> {"event":"state","held":{loc:[keys]},"calls":[...],...}
  {"cmd":"set_result","name":"clear","value":7}   override an engine return
  {"cmd":"set_result","name":"health","raise":"boom"}  make it raise
  {"cmd":"ping"}      -> {"event":"pong"}
  {"cmd":"close"}     -> deregister + worker.close(), "closed", exit 0
  {"cmd":"close","mode":"raw"}  -> only worker.close(): 0.5.6 loses its
                         DeRegisterMsg (loop stopped + linger-0 close race)
  {"cmd":"crash"}     -> exit 3 at once, no DeRegisterMsg (simulated crash)
  stdin EOF           -> like "close"

Asynchronous events:
  {"event":"ready",...}                   once the worker object exists
  {"event":"registered","heartbeat_url":..}  RegisterRetMsg received
  {"event":"register_failed","error":..}  (worker's controller thread is dead)
  {"event":"heartbeat_commands","commands":[{"command_type":"full_sync",...}]}
  {"event":"full_sync_started","reason":..} / {"event":"full_sync_finished","ok":..}
  {"event":"freeze","on":true|false}
  {"event":"engine_call","name":"clear","args":{...},"result":..}
  {"event":"error","error":"...","cmd":...}  bad command
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import threading
import time
from types import SimpleNamespace
from typing import Any, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

# The JSON protocol on stdout (imported first: it moves stdout's other writers to stderr).
from worker_protocol import FakeKey, ReportingHooks, run_driver, serve_commands  # noqa: E402
from worker_protocol import emit, jsonable as _jsonable  # noqa: E402

# --- environment, stub torch, lmcache --------------------------------------
import stub_torch  # noqa: E402

stub_torch.prepare_lmcache()  # sets LMCACHE_TRACK_USAGE=false, DO_NOT_TRACK=1

import lmcache.v1.cache_controller.worker as worker_mod  # noqa: E402
from lmcache.v1.cache_controller.message import (  # noqa: E402
    BatchedP2PLookupMsg,
    BatchedP2PLookupRetMsg,
    ErrorMsg,
    OpType,
)
from lmcache.v1.config import LMCacheEngineConfig  # noqa: E402
from lmcache.v1.metadata import LMCacheMetadata  # noqa: E402

stub_torch.skip_package_init("lmcache.v1.storage_backend")
from lmcache.v1.storage_backend.batched_message_sender import (  # noqa: E402
    BatchedMessageSender,
)

LOCAL_CPU = "LocalCPUBackend"


# --- fake engine -------------------------------------------------------------
class FakeLocalCPUBackend:
    """What FullSyncSender touches: get_keys() and str(backend)."""

    def __init__(self, engine: "FakeEngine"):
        self._engine = engine

    def get_keys(self) -> list[FakeKey]:
        return [FakeKey(k) for k in self._engine.held_keys(LOCAL_CPU)]

    def __str__(self) -> str:
        return LOCAL_CPU


class FakeEngine:
    """The LMCacheEngine surface LMCacheWorker uses, recording every call.

    Held keys are kept per location in insertion order (like the LRU hot
    cache).  Senders (one BatchedMessageSender per location, like
    LocalCPUBackend / LocalDiskBackend) are attached by the driver.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.held: dict[str, dict[int, None]] = {}
        self.calls: list[dict[str, Any]] = []
        self.frozen = False
        self.freeze_calls: list[bool] = []
        self.overrides: dict[str, dict[str, Any]] = {}
        self.senders: dict[str, BatchedMessageSender] = {}
        self.storage_manager = SimpleNamespace(
            local_cpu_backend=FakeLocalCPUBackend(self)
        )

    # -- bookkeeping --
    def held_keys(self, location: str) -> list[int]:
        with self._lock:
            return list(self.held.get(location, {}))

    def add(self, location: str, keys: list[int]) -> None:
        with self._lock:
            d = self.held.setdefault(location, {})
            for k in keys:
                d[k] = None

    def remove(self, location: str, keys: list[int]) -> list[int]:
        with self._lock:
            d = self.held.get(location, {})
            gone = [k for k in keys if k in d]
            for k in gone:
                del d[k]
            return gone

    def _record(self, name: str, args: dict[str, Any], default: Any) -> Any:
        ov = self.overrides.get(name, {})
        err = ov.get("raise")
        result = ov.get("value", default)
        call = {"name": name, "args": _jsonable(args), "result": None if err else result,
                "time": time.time()}
        if err:
            call["raised"] = err
        with self._lock:
            self.calls.append(call)
        emit("engine_call", **{k: v for k, v in call.items() if k != "time"})
        if err:
            raise RuntimeError(err)
        return result

    # -- LMCacheEngine surface used by LMCacheWorker / FullSyncSender --
    def freeze(self, enabled: bool) -> None:
        self.frozen = bool(enabled)
        with self._lock:
            self.freeze_calls.append(self.frozen)
        emit("freeze", on=self.frozen)

    def clear(self, locations: Optional[list[str]] = None, **kw: Any) -> int:
        # Like LocalCPUBackend.clear(): drop the keys and report them evicted
        # to the controller through the location's batched sender.
        if "raise" in self.overrides.get("clear", {}):
            return self._record("clear", {"locations": locations, **kw}, 0)
        locs = list(locations) if locations else list(self.held)
        removed: dict[str, list[int]] = {}
        for loc in locs:
            keys = self.held_keys(loc)
            removed[loc] = self.remove(loc, keys)
            if removed[loc] and loc in self.senders:
                for k in removed[loc]:
                    self.senders[loc].add_kv_op(op_type=OpType.EVICT, key=k)
                self.senders[loc].flush()
        n = sum(len(v) for v in removed.values())
        return self._record("clear", {"locations": locations, **kw,
                                      "removed": removed}, n)

    def health(self) -> int:
        return self._record("health", {}, 0)

    def lookup(self, tokens=None, search_range=None, lookup_id=None, pin=False, **kw):
        return self._record(
            "pin" if pin else "lookup",
            {"tokens": tokens, "search_range": search_range,
             "lookup_id": lookup_id, "pin": pin, **kw},
            len(tokens or []))

    def move(self, tokens=None, old_position=None, new_position=None,
             event_id=None, do_copy=None, **kw):
        return self._record(
            "move",
            {"tokens": tokens, "old_position": old_position,
             "new_position": new_position, "event_id": event_id,
             "do_copy": do_copy, **kw},
            len(tokens or []))

    def compress(self, tokens=None, method=None, location=None, event_id=None, **kw):
        return self._record(
            "compress",
            {"tokens": tokens, "method": method, "location": location,
             "event_id": event_id, **kw},
            len(tokens or []))

    def decompress(self, tokens=None, method=None, location=None, event_id=None, **kw):
        return self._record(
            "decompress",
            {"tokens": tokens, "method": method, "location": location,
             "event_id": event_id, **kw},
            len(tokens or []))


# --- the real worker, observed ----------------------------------------------
class ObservedWorker(ReportingHooks, worker_mod.LMCacheWorker):
    """LMCacheWorker with reporting hooks; every hook calls the real method."""

    heartbeats_sent = 0
    registered = False
    register_error: Optional[str] = None

    async def register(self):
        try:
            await super().register()
        except BaseException as e:  # the real start_all() then gives up
            self.register_error = f"{type(e).__name__}: {e}"
            emit("register_failed", error=self.register_error)
            raise
        self.registered = True
        emit("registered", heartbeat_url=self.controller_heartbeat_url,
             heartbeat_socket=self.heartbeat_socket is not None)

    # Set by Driver.close(): from then on no heartbeat is sent.  A heartbeat
    # that reaches the controller after the DeRegisterMsg would re-register
    # the worker (the controller treats a heartbeat from an unknown worker as
    # a re-registration), leaving a zombie entry behind.
    stopping = False
    heartbeat_idle: Optional[threading.Event] = None

    async def _send_heartbeat_msg(self, msg):
        if self.heartbeat_idle is None:
            self.heartbeat_idle = threading.Event()
            self.heartbeat_idle.set()
        if self.stopping:
            return worker_mod.HeartbeatRetMsg()
        self.heartbeat_idle.clear()
        try:
            ret = await super()._send_heartbeat_msg(msg)
        finally:
            self.heartbeat_idle.set()
        self.heartbeats_sent += 1
        return ret


# --- driver -------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pull", required=True, help="controller PULL host:port")
    p.add_argument("--reply", required=True, help="controller ROUTER host:port")
    p.add_argument("--instance-id", required=True)
    p.add_argument("--worker-id", type=int, default=0)
    p.add_argument("--worker-port", type=int, required=True,
                   help="port of the worker's REP socket (bound on *)")
    p.add_argument("--peer-init-url", default=None,
                   help="host:port; enables enable_p2p so RegisterMsg carries it")
    p.add_argument("--heartbeat-time", type=float, default=1.0,
                   help="seconds between heartbeats (<=0 disables)")
    p.add_argument("--heartbeat-delay", type=float, default=0.5)
    p.add_argument("--ip", default="127.0.0.1",
                   help="ip the worker reports (replaces rpc_utils.get_ip())")
    p.add_argument("--full-sync-startup-delay", type=float, default=0.2)
    p.add_argument("--full-sync-poll-interval", type=float, default=0.5)
    p.add_argument("--recv-timeout-ms", type=int, default=None,
                   help="worker_socket_recv_timeout_ms (LMCache default 30000)")
    p.add_argument("--send-timeout-ms", type=int, default=None,
                   help="worker_socket_send_timeout_ms (LMCache default 10000)")
    p.add_argument("--extra-config", default=None,
                   help="JSON object merged into extra_config last")
    return p.parse_args(argv)


def build_config(a: argparse.Namespace):
    extra: dict[str, Any] = {
        "full_sync_startup_delay_s": a.full_sync_startup_delay,
        "full_sync_status_poll_interval_s": a.full_sync_poll_interval,
        "full_sync_retry_delay_s": 0.2,
    }
    if a.recv_timeout_ms is not None:
        extra["worker_socket_recv_timeout_ms"] = a.recv_timeout_ms
    if a.send_timeout_ms is not None:
        extra["worker_socket_send_timeout_ms"] = a.send_timeout_ms
    if a.extra_config:
        extra.update(json.loads(a.extra_config))

    n = a.worker_id + 1  # world_size; lmcache_worker_ids=[worker_id]
    kwargs: dict[str, Any] = dict(
        enable_controller=True,
        lmcache_instance_id=a.instance_id,
        controller_pull_url=a.pull,
        controller_reply_url=a.reply,
        lmcache_worker_ids=[a.worker_id],
        lmcache_worker_ports=[a.worker_port],
        extra_config=extra,
    )
    if a.peer_init_url:
        host, _, port = a.peer_init_url.rpartition(":")
        kwargs.update(enable_p2p=True, p2p_host=host,
                      p2p_init_ports=[int(port)] * n,
                      p2p_lookup_ports=[int(port) + 1] * n)
    config = LMCacheEngineConfig.from_defaults(**kwargs)
    # The config schema types these as int (its converter would turn 0.5
    # into 0); the worker only ever passes them to asyncio.sleep().
    config.lmcache_worker_heartbeat_time = (
        a.heartbeat_time if a.heartbeat_time > 0 else None)
    config.lmcache_worker_heartbeat_delay_time = a.heartbeat_delay
    import torch  # the stub

    metadata = LMCacheMetadata(
        model_name="kvplane-interop-fake-model",
        world_size=n,
        local_world_size=n,
        worker_id=a.worker_id,
        local_worker_id=a.worker_id,
        kv_dtype=torch.float16,
        kv_shape=(1, 2, 256, 1, 8),
        use_mla=False,
        role="worker",
    )
    return config, metadata


class Driver:
    def __init__(self, a: argparse.Namespace):
        self.args = a
        # the worker reports this ip in RegisterMsg/HeartbeatMsg/DeRegisterMsg,
        # and the controller dials it for the REQ->REP downlink
        worker_mod.get_ip = lambda: a.ip
        self.config, self.metadata = build_config(a)
        self.engine = FakeEngine()
        self.worker = ObservedWorker(self.config, self.metadata, self.engine)
        self.closed = False

    def sender(self, location: str) -> BatchedMessageSender:
        s = self.engine.senders.get(location)
        if s is None:
            # exactly how LocalCPUBackend / LocalDiskBackend build theirs
            s = BatchedMessageSender(
                metadata=self.metadata,
                config=self.config,
                location=location,
                lmcache_worker=self.worker,
            )
            self.engine.senders[location] = s
        return s

    # -- commands --
    def cmd_admit(self, c: dict) -> dict:
        return self._kv_op(c, OpType.ADMIT)

    def cmd_evict(self, c: dict) -> dict:
        return self._kv_op(c, OpType.EVICT)

    def _kv_op(self, c: dict, op: "OpType") -> dict:
        location = c.get("location", LOCAL_CPU)
        keys = [int(k) for k in c["keys"]]
        s = self.sender(location)
        if op is OpType.ADMIT:
            self.engine.add(location, keys)
        else:
            self.engine.remove(location, keys)
        for k in keys:
            s.add_kv_op(op_type=op, key=k)
        s.flush()  # returns once the batch is handed to worker.put_msg()
        return {"event": "admitted" if op is OpType.ADMIT else "evicted",
                "location": location, "count": len(keys),
                "frozen": self.engine.frozen,
                "next_seq": s.sequence_number}

    def cmd_lookup(self, c: dict) -> dict:
        msg = BatchedP2PLookupMsg(
            hashes=[int(h) for h in c["hashes"]],
            instance_id=self.config.lmcache_instance_id,
            worker_id=int(c.get("worker_id", self.worker.worker_id)),
        )
        timeout = float(c.get("timeout", 35.0))
        fut = asyncio.run_coroutine_threadsafe(
            self.worker.async_put_and_wait_msg(msg), self.worker.loop)
        ret = fut.result(timeout=timeout)
        if isinstance(ret, ErrorMsg):
            return {"event": "lookup_result", "error": ret.error}
        if isinstance(ret, BatchedP2PLookupRetMsg):
            return {"event": "lookup_result",
                    "layout_info": [list(x) for x in ret.layout_info]}
        return {"event": "lookup_result", "error": f"unexpected reply {type(ret).__name__}"}

    def cmd_state(self, c: dict) -> dict:
        w = self.worker
        with self.engine._lock:
            held = {loc: list(d) for loc, d in self.engine.held.items()}
            calls = list(self.engine.calls)
            freezes = list(self.engine.freeze_calls)
        return {"event": "state", "instance_id": w.lmcache_instance_id,
                "worker_id": w.worker_id, "registered": w.registered,
                "register_error": w.register_error,
                "heartbeat_url": w.controller_heartbeat_url,
                "heartbeats_sent": w.heartbeats_sent,
                "frozen": self.engine.frozen, "freeze_calls": freezes,
                "held": held, "calls": calls,
                "next_seq": {loc: s.sequence_number
                             for loc, s in self.engine.senders.items()}}

    def cmd_set_result(self, c: dict) -> dict:
        ov: dict[str, Any] = {}
        if "value" in c:
            ov["value"] = c["value"]
        if "raise" in c:
            ov["raise"] = c["raise"]
        if ov:
            self.engine.overrides[c["name"]] = ov
        else:
            self.engine.overrides.pop(c["name"], None)
        return {"event": "result_set", "name": c["name"], **ov}

    def cmd_ping(self, c: dict) -> dict:
        return {"event": "pong"}

    def close(self, mode: str = "deregister") -> dict:
        """Shut the worker down.

        LMCacheWorker.close() in 0.5.6 enqueues its DeRegisterMsg and stops
        the event loop in the same breath, then closes the PUSH socket with
        linger 0, so that DeRegisterMsg practically never reaches the
        controller.  mode "deregister" (default) stops heartbeating (waiting
        for an in-flight heartbeat), sends a DeRegisterMsg through the
        worker's own deregister(), waits for the PUSH loop to hand it to ZMQ,
        then calls the real close() (whose own second DeRegisterMsg is
        normally lost); mode "raw" calls only close(), reproducing 0.5.6's
        behaviour, heartbeats included.
        """
        if self.closed:
            return {}
        self.closed = True
        for s in list(self.engine.senders.values()):
            try:
                s.close()  # flush pending admits/evicts into the worker queue
            except Exception as e:  # pragma: no cover
                print(f"sender close: {e}", file=sys.stderr)
        sent = False
        if mode != "raw" and self.worker.registered:
            self.worker.stopping = True  # no heartbeat may follow the DeRegisterMsg
            idle = self.worker.heartbeat_idle
            if idle is not None:  # wait for an in-flight heartbeat's reply
                idle.wait(timeout=self.worker.socket_recv_timeout_ms / 1000 + 1)
            self.worker.deregister()
            sent = self._drain_queue(2.0)
            time.sleep(0.3)  # let ZMQ's I/O thread transmit before linger-0 close
        else:
            self._drain_queue(1.0)
        self.worker.close()
        return {"mode": mode, "deregister_sent": sent}

    def _drain_queue(self, timeout: float) -> bool:
        """Wait until the worker's PUSH loop has taken every queued message."""
        time.sleep(0.02)  # put_msg() goes through call_soon_threadsafe
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.worker.msg_queue.empty():
                return True
            time.sleep(0.01)
        return False

    def run(self) -> int:
        a = self.args
        emit("ready", instance_id=a.instance_id, worker_id=a.worker_id,
             worker_port=a.worker_port, ip=a.ip, peer_init_url=a.peer_init_url,
             pid=os.getpid())

        def crash(c: dict) -> None:
            emit("crashing")
            os._exit(3)

        return serve_commands(self, lambda c: self.close(c.get("mode", "deregister")),
                              {"crash": crash})


def main(argv=None) -> int:
    return run_driver(lambda: Driver(parse_args(argv)))


if __name__ == "__main__":
    sys.exit(main())
