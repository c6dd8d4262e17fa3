"""The JSON-lines protocol both LMCache worker drivers speak, and what they share around the
real ``LMCacheWorker``: importable with no torch and no LMCache.

``lmcache_worker.py`` (0.5.6, stand-in torch) and ``lmcache_version_worker.py`` (any release,
real torch) import it FIRST: importing it points fd 1 and ``sys.stdout`` at stderr, so that
LMCache's logs and stray prints never corrupt the JSON stream, and keeps the real stdout for
:func:`emit`. It holds the event writer, the fake engine key, the worker hooks that report
full syncs and heartbeat commands, and the stdin command loop; each driver keeps what depends
on its LMCache (the engine, the worker's other hooks, the configuration).
"""

from __future__ import annotations

import json
import os
import sys
import threading
import traceback
from typing import Any, Callable

# stdout belongs to the JSON protocol: keep a private handle on it and point fd 1 (and
# sys.stdout) at stderr.
_JSON_OUT = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
os.dup2(2, 1)
sys.stdout = sys.stderr
_OUT_LOCK = threading.Lock()


def jsonable(v: Any) -> Any:
    """`v` as JSON values: containers element by element, enums by value, the rest by repr."""
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple, set, frozenset)):
        return [jsonable(x) for x in v]
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if hasattr(v, "value") and isinstance(getattr(v, "value"), (str, int)):
        return v.value  # enums
    return repr(v)


def emit(event: str, **fields: Any) -> None:
    """Writes one event line (flushed) on the real stdout."""
    line = json.dumps({"event": event, **jsonable(fields)}, separators=(",", ":"))
    with _OUT_LOCK:
        _JSON_OUT.write(line + "\n")
        _JSON_OUT.flush()


def run_driver(make: Callable[[], Any]) -> int:
    """Builds the driver with ``make()`` and runs it (``driver.run()``, the exit code), then
    flushes the event stream and exits at once: daemon threads (the worker's loop, the
    senders) must not keep the process alive. A failed start is an "error" event and 2."""
    try:
        driver = make()
    except Exception as e:
        traceback.print_exc()
        emit("error", error=f"startup failed: {type(e).__name__}: {e}")
        return 2
    rc = driver.run()
    _JSON_OUT.flush()
    os._exit(rc)


class FakeKey:
    """Stands in for lmcache.utils.CacheEngineKey: full sync reads .chunk_hash."""

    __slots__ = ("chunk_hash",)

    def __init__(self, chunk_hash: int):
        self.chunk_hash = chunk_hash

    def __repr__(self) -> str:
        return f"FakeKey({self.chunk_hash})"


class ReportingHooks:
    """Hooks of ``LMCacheWorker`` that report what the controller asked for, each calling the
    real method: the commands a heartbeat answer carries, and each full sync's start and end.
    Listed before the worker class among the bases."""

    def _handle_heartbeat_commands(self, ret_msg):
        if ret_msg.has_commands():
            emit("heartbeat_commands", commands=[
                {"command_type": type(c).__struct_config__.tag, "reason": c.reason,
                 "args": getattr(c, "args", None)} for c in ret_msg.commands])
        return super()._handle_heartbeat_commands(ret_msg)

    def _get_full_sync_sender(self):
        created = self._full_sync_sender is None
        sender = super()._get_full_sync_sender()
        if created:
            real = sender.start_full_sync

            async def start_full_sync(reason=None):
                emit("full_sync_started", reason=reason)
                ok = False
                try:
                    ok = await real(reason)
                    return ok
                finally:
                    emit("full_sync_finished", ok=bool(ok), reason=reason)

            sender.start_full_sync = start_full_sync
        return sender


def serve_commands(driver: Any, close: Callable[[dict], dict],
                   special: dict[str, Callable[[dict], None]] | None = None) -> int:
    """Reads JSON command lines from stdin until ``close`` or EOF and answers each with the
    event that ``driver.cmd_<name>(command)`` returns (its "id" echoed). ``close(command)``
    shuts the worker down and returns the fields of the "closed" event (EOF passes
    ``{}``); ``special`` maps other names to handlers that emit on their own. A bad line or
    a failing command is an "error" event; the loop goes on."""
    special = special or {}
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        try:
            c = json.loads(line)
            name = c["cmd"]
        except Exception as e:
            emit("error", error=f"bad command line: {e}", line=line)
            continue
        echo = {"id": c["id"]} if "id" in c else {}
        if name == "close":
            emit("closed", **close(c), **echo)
            return 0
        if name in special:
            special[name](c)
            continue
        fn = getattr(driver, f"cmd_{name}", None)
        if fn is None:
            emit("error", error=f"unknown cmd {name!r}", cmd=c)
            continue
        try:
            reply = fn(c)
        except Exception as e:
            traceback.print_exc()
            emit("error", error=f"{type(e).__name__}: {e}", cmd=c, **echo)
            continue
        reply.update(echo)
        emit(reply.pop("event"), **reply)
    emit("closed", reason="stdin_eof", **close({}))
    return 0
