#!/usr/bin/env python3
"""Validate the interop harness against the REAL LMCache 0.5.6 controller.

Starts ``run_lmcache_controller.py`` (the real ``lmcache.v1.api_server``) and
two ``lmcache_worker.py`` drivers (real ``LMCacheWorker``s with fake engines)
on 127.0.0.1, then checks, end to end:

  * both workers register (RegisterRetMsg carries heartbeat_url) and heartbeat;
  * the controller's start-up full sync (reason controller_restart) runs on
    both and they leave freeze mode;
  * A's admits, sent through LMCache's BatchedMessageSender, appear in
    GET /controller/key-stats and /controller/workers;
  * POST /query_worker_info reports ip 127.0.0.1 and A's peer_init_url;
  * B's BatchedP2PLookupMsg finds A (prefix length, peer url), an evict is
    reflected, a lookup of only-own keys gets the miss sentinel;
  * POST /health and POST /clear reach A's fake engine (REQ->REP downlink);
  * after the controller is killed and restarted on the same ports, A and B
    (still heartbeating) get a full_sync command and key-stats shows A's keys
    again; /health works against the re-registered worker;
  * close() deregisters both workers.
  * (informational) the unmodified LMCacheWorker.close() loses its DeRegisterMsg.

Everything is bounded in time; children are killed on exit.  Exit status 0
only if every check passed.  The last line is "N passed, N failed".

Usage: .venv/bin/python tests/interop/validate_against_lmcache.py [-v]
"""

from __future__ import annotations

import argparse
import atexit
import shutil
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from typing import Any, Callable, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
U64_MAX = 2**64 - 1

CHILDREN: list[subprocess.Popen] = []
VERBOSE = False


def log(msg: str) -> None:
    print(f"[validate] {msg}", flush=True)


def free_ports(n: int) -> list[int]:
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def kill_child(p: subprocess.Popen, grace: float = 3.0) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait(timeout=5)


def kill_all() -> None:
    for p in CHILDREN:
        try:
            kill_child(p, grace=1.0)
        except Exception:
            pass


def spawn(argv: list[str], stdout, stderr, stdin=subprocess.DEVNULL) -> subprocess.Popen:
    p = subprocess.Popen(argv, stdin=stdin, stdout=stdout, stderr=stderr,
                         cwd=ROOT, start_new_session=True, text=True, bufsize=1)
    CHILDREN.append(p)
    return p


# --- HTTP ----------------------------------------------------------------------
class Http:
    def __init__(self, port: int):
        self.base = f"http://127.0.0.1:{port}"

    def call(self, method: str, path: str, body: Any = None,
             timeout: float = 10.0) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                raw = r.read().decode()
                status = r.status
        except urllib.error.HTTPError as e:
            raw = e.read().decode()
            status = e.code
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def get(self, path: str, **kw) -> tuple[int, Any]:
        return self.call("GET", path, **kw)

    def post(self, path: str, body: Any, **kw) -> tuple[int, Any]:
        return self.call("POST", path, body, **kw)


# --- the real controller ----------------------------------------------------------
class Controller:
    def __init__(self, python: str, http_port: int, ports: dict[str, int], logdir: str):
        self.python, self.http_port, self.ports, self.logdir = python, http_port, ports, logdir
        self.proc: Optional[subprocess.Popen] = None
        self.http = Http(http_port)
        self.generation = 0

    @property
    def logfile(self) -> str:
        return os.path.join(self.logdir, f"controller{self.generation}.log")

    def start(self, timeout: float = 40.0) -> None:
        self.generation += 1
        out = open(self.logfile, "w")
        self.proc = spawn(
            [self.python, os.path.join(HERE, "run_lmcache_controller.py"),
             "--host", "127.0.0.1", "--port", str(self.http_port),
             "--monitor-ports", json.dumps(self.ports)],
            stdout=out, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"controller exited rc={self.proc.returncode}; "
                                   f"see {self.logfile}")
            try:
                status, _ = self.http.get("/controller/key-stats", timeout=2)
                if status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"controller did not answer HTTP within {timeout}s")

    def stop(self) -> None:
        if self.proc is not None:
            kill_child(self.proc)
            self.proc = None

    def log_tail(self, n: int = 30) -> str:
        try:
            with open(self.logfile) as f:
                return "".join(f.readlines()[-n:])
        except OSError:
            return ""


# --- a driver worker ------------------------------------------------------------
class Worker:
    def __init__(self, name: str, python: str, args: list[str], logdir: str):
        self.name = name
        self.errfile = os.path.join(logdir, f"worker_{name}.log")
        self.proc = spawn([python, os.path.join(HERE, "lmcache_worker.py"), *args],
                          stdout=subprocess.PIPE, stderr=open(self.errfile, "w"),
                          stdin=subprocess.PIPE)
        self.events: list[dict] = []
        self.cond = threading.Condition()
        self.next_id = 0
        threading.Thread(target=self._reader, daemon=True).start()

    def _reader(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                ev = {"event": "bad_json", "line": line}
            if VERBOSE:
                log(f"  {self.name} <- {line.strip()}")
            with self.cond:
                self.events.append(ev)
                self.cond.notify_all()
        with self.cond:
            self.events.append({"event": "eof"})
            self.cond.notify_all()

    def send(self, cmd: dict) -> None:
        assert self.proc.stdin is not None
        if VERBOSE:
            log(f"  {self.name} -> {json.dumps(cmd)}")
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def wait_for(self, pred: Callable[[dict], bool], timeout: float,
                 since: int = 0) -> Optional[dict]:
        deadline = time.monotonic() + timeout
        with self.cond:
            i = since
            while True:
                while i < len(self.events):
                    ev = self.events[i]
                    i += 1
                    if pred(ev):
                        return ev
                    if ev["event"] == "eof":
                        return None
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.cond.wait(left)

    def mark(self) -> int:
        with self.cond:
            return len(self.events)

    def request(self, cmd: dict, timeout: float = 15.0) -> Optional[dict]:
        self.next_id += 1
        cmd = {**cmd, "id": self.next_id}
        mark = self.mark()
        self.send(cmd)
        rid = self.next_id
        return self.wait_for(lambda e: e.get("id") == rid, timeout, since=mark)

    def event(self, name: str, timeout: float, since: int = 0,
              pred: Callable[[dict], bool] = lambda e: True) -> Optional[dict]:
        return self.wait_for(lambda e: e["event"] == name and pred(e), timeout, since)

    def close(self, mode: str = "deregister", timeout: float = 15.0) -> Optional[dict]:
        try:
            ev = self.request({"cmd": "close", "mode": mode}, timeout=timeout)
        except (BrokenPipeError, OSError):
            ev = None
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            kill_child(self.proc)
        return ev


# --- checks -------------------------------------------------------------------
class Checks:
    def __init__(self):
        self.passed = 0
        self.failed = 0
        self.infos: list[str] = []

    def check(self, name: str, ok: bool, detail: Any = "") -> bool:
        if ok:
            self.passed += 1
            log(f"PASS {name}: {detail}")
        else:
            self.failed += 1
            log(f"FAIL {name}: {detail}")
        return ok

    def info(self, name: str, detail: Any) -> None:
        self.infos.append(f"{name}: {detail}")
        log(f"INFO {name}: {detail}")


def poll(fn: Callable[[], Any], ok: Callable[[Any], bool], timeout: float,
         interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
        except Exception as e:  # keep polling through transient errors
            last = e
        if not isinstance(last, Exception) and ok(last):
            return last
        if time.monotonic() >= deadline:
            return last
        time.sleep(interval)


def instance_keys(stats: Any, inst: str) -> Optional[int]:
    if not isinstance(stats, dict):
        return None
    for i in stats.get("instances", []):
        if i.get("instance_id") == inst:
            return i.get("key_count")
    return None


def run(args: argparse.Namespace) -> Checks:
    c = Checks()
    logdir = tempfile.mkdtemp(prefix="kvplane-interop-")
    log(f"logs in {logdir}")
    http_port, pull, reply, hb, a_port, b_port, a_peer, b_peer = free_ports(8)
    ports = {"pull": pull, "reply": reply, "heartbeat": hb}
    log(f"controller http 127.0.0.1:{http_port} monitor ports {ports}")

    ctl = Controller(args.python, http_port, ports, logdir)
    t0 = time.monotonic()
    ctl.start()
    c.check("controller_up", True, f"real lmcache.v1.api_server answered HTTP after "
            f"{time.monotonic() - t0:.1f}s")
    http = ctl.http

    common = ["--pull", f"127.0.0.1:{pull}", "--reply", f"127.0.0.1:{reply}",
              "--heartbeat-time", "1", "--heartbeat-delay", "0.5",
              "--recv-timeout-ms", "3000"]
    A = Worker("A", args.python, [*common, "--instance-id", "inst-A", "--worker-id", "0",
                                  "--worker-port", str(a_port),
                                  "--peer-init-url", f"127.0.0.1:{a_peer}"], logdir)
    B = Worker("B", args.python, [*common, "--instance-id", "inst-B", "--worker-id", "0",
                                  "--worker-port", str(b_port),
                                  "--peer-init-url", f"127.0.0.1:{b_peer}"], logdir)
    try:
        for w in (A, B):
            ev = w.event("registered", 30)
            c.check(f"{w.name}_registered", ev is not None and
                    ev.get("heartbeat_url") == f"127.0.0.1:{hb}", ev)

        # --- start-up full sync (need_full_sync_all is True on every start) ---
        for w in (A, B):
            cmd = w.event("heartbeat_commands", 15)
            done = w.event("full_sync_finished", 20)
            c.check(f"{w.name}_startup_full_sync",
                    cmd is not None and cmd["commands"][0]["command_type"] == "full_sync"
                    and done is not None and done.get("ok") is True,
                    {"commands": cmd and cmd["commands"], "finished": done})
        st = A.request({"cmd": "state"})
        c.check("A_freeze_on_off", st is not None and st["freeze_calls"][:2] == [True, False]
                and st["frozen"] is False, st and st["freeze_calls"])
        c.check("A_heartbeating", st is not None and st["heartbeats_sent"] >= 1,
                st and st["heartbeats_sent"])

        # --- admits through BatchedMessageSender -> key-stats ---
        keys_a = [101, 102, 103, -7, U64_MAX]
        r = A.request({"cmd": "admit", "keys": keys_a, "location": "LocalCPUBackend"})
        c.check("A_admit_ack", r is not None and r["event"] == "admitted"
                and r["next_seq"] == len(keys_a), r)
        stats = poll(lambda: http.get("/controller/key-stats")[1],
                     lambda s: instance_keys(s, "inst-A") == len(keys_a), 10)
        c.check("key_stats_shows_A", instance_keys(stats, "inst-A") == len(keys_a)
                and instance_keys(stats, "inst-B") == 0, stats)
        status, workers = http.get("/controller/workers?instance_id=inst-A")
        c.check("controller_workers_A", status == 200 and isinstance(workers, dict)
                and workers.get("workers", [{}])[0].get("key_count") == len(keys_a),
                workers)
        status, qwi = http.post("/query_worker_info", {"instance_id": "all", "worker_ids": None})
        infos = {w["instance_id"]: w for w in (qwi or {}).get("worker_infos", [])} \
            if isinstance(qwi, dict) else {}
        c.check("query_worker_info", status == 200 and
                infos.get("inst-A", {}).get("ip") == "127.0.0.1" and
                infos.get("inst-A", {}).get("port") == a_port and
                infos.get("inst-A", {}).get("peer_init_url") == f"127.0.0.1:{a_peer}",
                infos.get("inst-A"))

        # --- P2P lookup via B's DEALER ---
        r = B.request({"cmd": "lookup", "hashes": [101, 102, 103, 999]})
        want = [["inst-A", "LocalCPUBackend", 3, f"127.0.0.1:{a_peer}"]]
        c.check("B_lookup_finds_A", r is not None and r.get("layout_info") == want, r)
        r = B.request({"cmd": "lookup", "hashes": [U64_MAX, -7, 5]})
        c.check("B_lookup_u64_and_negative", r is not None and
                r.get("layout_info") == [["inst-A", "LocalCPUBackend", 2, f"127.0.0.1:{a_peer}"]],
                r)
        r = A.request({"cmd": "evict", "keys": [102]})
        c.check("A_evict_ack", r is not None and r["event"] == "evicted", r)
        r = poll(lambda: B.request({"cmd": "lookup", "hashes": [101, 102, 103]}),
                 lambda x: x is not None and x.get("layout_info", [[0, 0, 0]])[0][2] == 1, 5)
        c.check("B_lookup_after_evict", r is not None and
                r.get("layout_info") == [["inst-A", "LocalCPUBackend", 1, f"127.0.0.1:{a_peer}"]],
                r)
        r = A.request({"cmd": "lookup", "hashes": [101]})
        c.check("A_lookup_own_key_is_miss", r is not None and
                r.get("layout_info") == [["", "", 0, ""]], r)

        # --- controller -> worker downlink ---
        mark = A.mark()
        status, body = http.post("/health", {"instance_id": "inst-A"})
        call = A.event("engine_call", 5, since=mark, pred=lambda e: e["name"] == "health")
        c.check("http_health", status == 200 and isinstance(body, dict)
                and body.get("error_codes") == {"0": 0} and call is not None,
                {"status": status, "body": body, "engine_call": call})
        mark = A.mark()
        status, body = http.post("/clear", {"instance_id": "inst-A",
                                            "location": "LocalCPUBackend"})
        call = A.event("engine_call", 5, since=mark, pred=lambda e: e["name"] == "clear")
        c.check("http_clear_reaches_A", status == 200 and isinstance(body, dict)
                and body.get("num_tokens") == 4 and call is not None
                and call["args"]["locations"] == ["LocalCPUBackend"],
                {"status": status, "body": body, "engine_call": call})
        stats = poll(lambda: http.get("/controller/key-stats")[1],
                     lambda s: instance_keys(s, "inst-A") == 0, 10)
        c.check("clear_evicts_reach_controller", instance_keys(stats, "inst-A") == 0, stats)

        # --- controller restart -> full sync rebuilds A's keys ---
        keys_a2 = [201, 202, 203]
        r = A.request({"cmd": "admit", "keys": keys_a2})
        stats = poll(lambda: http.get("/controller/key-stats")[1],
                     lambda s: instance_keys(s, "inst-A") == 3, 10)
        c.check("A_readmit_before_restart", instance_keys(stats, "inst-A") == 3, stats)
        mark_a, mark_b = A.mark(), B.mark()
        ctl.stop()
        log("controller killed; restarting on the same ports")
        time.sleep(0.5)
        t0 = time.monotonic()
        ctl.start()
        cmd = A.event("heartbeat_commands", 20, since=mark_a)
        done = A.event("full_sync_finished", 30, since=mark_a)
        c.check("A_full_sync_after_restart",
                cmd is not None and cmd["commands"][0]["command_type"] == "full_sync"
                and done is not None and done.get("ok") is True,
                {"commands": cmd and cmd["commands"], "finished": done,
                 "after_s": round(time.monotonic() - t0, 1)})
        stats = poll(lambda: http.get("/controller/key-stats")[1],
                     lambda s: instance_keys(s, "inst-A") == 3 and
                     instance_keys(s, "inst-B") == 0, 15)
        c.check("key_stats_after_restart", instance_keys(stats, "inst-A") == 3
                and instance_keys(stats, "inst-B") == 0, stats)
        cmd_b = B.event("heartbeat_commands", 10, since=mark_b)
        c.check("B_full_sync_after_restart", cmd_b is not None, cmd_b)
        mark = A.mark()
        status, body = http.post("/health", {"instance_id": "inst-A"})
        call = A.event("engine_call", 5, since=mark, pred=lambda e: e["name"] == "health")
        c.check("http_health_after_restart", status == 200 and isinstance(body, dict)
                and body.get("error_codes") == {"0": 0} and call is not None, body)
        r = B.request({"cmd": "lookup", "hashes": [201, 202, 204]})
        c.check("B_lookup_after_restart", r is not None and r.get("layout_info") ==
                [["inst-A", "LocalCPUBackend", 2, f"127.0.0.1:{a_peer}"]], r)

        # --- clean shutdown deregisters ---
        for w in (A, B):
            ev = w.close()
            c.check(f"{w.name}_close", ev is not None and ev.get("deregister_sent") is True
                    and w.proc.returncode == 0, {"event": ev, "rc": w.proc.returncode})
        stats = poll(lambda: http.get("/controller/key-stats")[1],
                     lambda s: isinstance(s, dict) and s.get("total_worker_count") == 0, 10)
        c.check("deregistered", isinstance(stats, dict) and stats.get("total_worker_count") == 0,
                stats)

        # --- informational: the unmodified close() path ---
        if not args.skip_raw_close:
            (r_port,) = free_ports(1)
            R = Worker("R", args.python, [*common, "--instance-id", "inst-R",
                                          "--worker-port", str(r_port),
                                          "--heartbeat-time", "0"], logdir)
            if R.event("registered", 30) is not None:
                R.close(mode="raw")
                stats = poll(lambda: http.get("/controller/key-stats")[1],
                             lambda s: instance_keys(s, "inst-R") is None, 2)
                still = instance_keys(stats, "inst-R") is not None
                c.info("raw_LMCacheWorker.close()",
                       "DeRegisterMsg LOST, worker still registered" if still
                       else "DeRegisterMsg delivered")
    finally:
        if c.failed:
            log("---- controller log tail ----")
            print(ctl.log_tail(), flush=True)
            for w in (A, B):
                log(f"---- worker {w.name} stderr tail ----")
                try:
                    with open(w.errfile) as f:
                        print("".join(f.readlines()[-15:]), flush=True)
                except OSError:
                    pass
        for w in (A, B):
            if w.proc.poll() is None:
                kill_child(w.proc)
        ctl.stop()
        if c.failed == 0 and not args.keep_logs:
            shutil.rmtree(logdir, ignore_errors=True)
        else:
            log(f"logs kept in {logdir}")
    return c


def main() -> int:
    global VERBOSE
    default_py = os.path.join(ROOT, ".venv", "bin", "python")
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--python", default=default_py if os.path.exists(default_py)
                   else sys.executable, help="interpreter with lmcache installed")
    p.add_argument("--timeout", type=float, default=240.0, help="overall watchdog (s)")
    p.add_argument("--skip-raw-close", action="store_true")
    p.add_argument("--keep-logs", action="store_true", help="keep the log dir on success")
    p.add_argument("-v", "--verbose", action="store_true", help="echo worker JSON traffic")
    args = p.parse_args()
    VERBOSE = args.verbose

    atexit.register(kill_all)

    def on_signal(signum, _frame):
        log(f"signal {signum}: killing children")
        kill_all()
        os._exit(128 + signum)

    for s in (signal.SIGINT, signal.SIGTERM):
        signal.signal(s, on_signal)

    def watchdog():
        log(f"FAIL watchdog: no result after {args.timeout}s")
        kill_all()
        print("0 passed, 1 failed", flush=True)
        os._exit(1)

    timer = threading.Timer(args.timeout, watchdog)
    timer.daemon = True
    timer.start()
    t0 = time.monotonic()
    try:
        c = run(args)
    except Exception as e:
        log(f"FAIL harness error: {type(e).__name__}: {e}")
        kill_all()
        print("0 passed, 1 failed", flush=True)
        return 1
    finally:
        timer.cancel()
    log(f"finished in {time.monotonic() - t0:.1f}s")
    print(f"{c.passed} passed, {c.failed} failed", flush=True)
    return 0 if c.failed == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
