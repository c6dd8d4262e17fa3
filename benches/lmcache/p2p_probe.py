"""Time the controller's P2P lookup round trip as LMCache 0.5.6's Python worker sees it.

A worker is registered and keys admitted with LMCache's own message classes
(``lmcache.v1.cache_controller.message``, msgspec-encoded as its worker encodes them; where
LMCache is not installed, identical msgspec structs that encode to the same bytes), then
``BatchedP2PLookupMsg`` requests go over a pyzmq DEALER to the controller's reply ROUTER, as
``LMCacheWorker.async_put_and_wait_msg`` sends them: ``[b"", payload]`` out, ``[b"", reply]``
back. Each request is encoded before the clock starts; the clock covers send to receive;
every answer is then decoded with LMCache's ``Msg`` union and checked (holder, location, all
hashes hit, peer URL). Garbage collection is off while timing. The floor is a bare pyzmq
DEALER round trip to a pyzmq ROUTER echo in another process, with the same request bytes.

Usage (the interop venv, scripts/setup-python.sh: lmcache 0.5.6, pyzmq, msgspec):

  p2p_probe.py lookup --reply 127.0.0.1:8400 --pull 127.0.0.1:8300 [--requests 20000]
      one measurement against a running controller
  p2p_probe.py echo [--requests 20000]
      the bare DEALER <-> ROUTER echo floor
  p2p_probe.py compare [--rounds 5] LABEL=KVPLANE_BIN [LABEL=KVPLANE_BIN ...]
      per round: the echo floor, then for each binary a fresh ``BIN serve`` on free
      127.0.0.1 ports and one lookup measurement (interleaved); prints every run and the
      median p50/p90/p99 per label, with the load average around each run

Common options: --requests N (timed, default 20000), --warmup N (default 2000), --hashes H
(per request, default 100), --chains C (chains of H keys admitted, default 100), --json;
--server-cpus 2,3 pins the servers it starts (tokio then runs one worker per CPU given).
Exit status 1 on any wrong answer or failed step.
"""

from __future__ import annotations

import argparse
import enum
import gc
import json
import multiprocessing
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Union

import msgspec
import zmq

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "interop"))
try:
    import stub_torch

    stub_torch.prepare_lmcache()
    # The package's __init__ imports the worker (and through it the engine); the message
    # module alone needs neither.
    stub_torch.skip_package_init("lmcache.v1.cache_controller")
    from lmcache.v1.cache_controller.message import (
        BatchedKVOperationMsg,
        BatchedP2PLookupMsg,
        BatchedP2PLookupRetMsg,
        DeRegisterMsg,
        KVOpEvent,
        Msg,
        OpType,
        RegisterMsg,
        RegisterRetMsg,
    )

    CLASSES = "lmcache 0.5.6"
except ImportError:
    # Where LMCache is not installed: the same structs, which msgspec encodes to the same
    # bytes (tagged maps named after the class, fields in declaration order).
    class OpType(enum.Enum):
        ADMIT = "admit"
        EVICT = "evict"

    class KVOpEvent(msgspec.Struct):
        op_type: OpType
        key: int
        seq_num: int

    class RegisterMsg(msgspec.Struct, tag=True):
        instance_id: str
        worker_id: int
        ip: str
        port: int
        peer_init_url: Optional[str]

    class RegisterRetMsg(msgspec.Struct, tag=True):
        extra_config: dict[str, str] = msgspec.field(default_factory=dict)

    class DeRegisterMsg(msgspec.Struct, tag=True):
        instance_id: str
        worker_id: int
        ip: str
        port: int

    class BatchedKVOperationMsg(msgspec.Struct, tag=True):
        instance_id: str
        worker_id: int
        location: str
        operations: list[KVOpEvent]

    class BatchedP2PLookupMsg(msgspec.Struct, tag=True):
        hashes: list[int]
        instance_id: str
        worker_id: int

    class BatchedP2PLookupRetMsg(msgspec.Struct, tag=True):
        layout_info: list[tuple[str, str, int, str]]

    class ErrorMsg(msgspec.Struct, tag=True):
        error: str

    Msg = Union[RegisterMsg, RegisterRetMsg, DeRegisterMsg, BatchedKVOperationMsg,
                BatchedP2PLookupMsg, BatchedP2PLookupRetMsg, ErrorMsg]
    CLASSES = "msgspec mirror of lmcache 0.5.6"

LOCATION = "LocalCPUBackend"
BATCH = 50  # ops per BatchedKVOperationMsg, as LMCache's BatchedMessageSender sends them
TIMEOUT_MS = 10_000


def percentile(sorted_us: list[float], q: float) -> float:
    """Nearest-rank percentile of an ascending list."""
    i = min(len(sorted_us) - 1, max(0, int(round(q * len(sorted_us) + 0.5)) - 1))
    return sorted_us[i]


def summary(samples_ns: list[int]) -> dict:
    us = sorted(s / 1000 for s in samples_ns)
    return {
        "count": len(us),
        "p50_us": round(percentile(us, 0.50), 1),
        "p90_us": round(percentile(us, 0.90), 1),
        "p99_us": round(percentile(us, 0.99), 1),
        "mean_us": round(statistics.fmean(us), 1),
    }


def loadavg() -> str:
    with open("/proc/loadavg", encoding="ascii") as f:
        return " ".join(f.read().split()[:3])


def dealer(ctx: zmq.Context, addr: str) -> zmq.Socket:
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    s.setsockopt(zmq.RCVTIMEO, TIMEOUT_MS)
    s.setsockopt(zmq.SNDTIMEO, TIMEOUT_MS)
    s.connect(f"tcp://{addr}")
    return s


def request(sock: zmq.Socket, payload: bytes):
    sock.send_multipart([b"", payload])
    return msgspec.msgpack.decode(sock.recv_multipart()[-1], type=Msg)


def time_round_trips(sock: zmq.Socket, payloads: list[bytes], warmup: int) -> tuple[list[int], list[bytes]]:
    """Sends each payload and waits for its answer; returns the timed samples and answers."""
    send, recv, clock = sock.send_multipart, sock.recv_multipart, time.perf_counter_ns
    for p in payloads[:warmup]:
        send([b"", p])
        recv()
    samples, answers = [], []
    gc.collect()
    gc.disable()
    try:
        for p in payloads[warmup:]:
            t0 = clock()
            send([b"", p])
            frames = recv()
            samples.append(clock() - t0)
            answers.append(frames[-1])
    finally:
        gc.enable()
    return samples, answers


def lookup(args) -> dict:
    """One measurement against a running controller."""
    tag = f"probe-{os.getpid():x}-{time.monotonic_ns() & 0xFFFFFF:x}"
    holder, asker = f"{tag}-holder", f"{tag}-asker"
    ctx = zmq.Context()
    # The holder's command port: a socket that never answers (no command is sent in a probe).
    cmd = ctx.socket(zmq.ROUTER)
    cmd.setsockopt(zmq.LINGER, 0)
    cmd_port = cmd.bind_to_random_port("tcp://127.0.0.1")
    peer_url = f"127.0.0.1:{cmd_port + 1}"
    req = dealer(ctx, args.reply)
    reg = request(req, msgspec.msgpack.encode(RegisterMsg(
        instance_id=holder, worker_id=0, ip="127.0.0.1", port=cmd_port, peer_init_url=peer_url)))
    if not isinstance(reg, RegisterRetMsg):
        raise SystemExit(f"registration refused: {reg!r}")

    # Chain c holds keys base + c*H .. base + (c+1)*H, admitted in batches of 50 over PUSH.
    base = (os.getpid() << 32) | (time.monotonic_ns() & 0xFFFF_FFFF)
    keys = [(base + i) & ((1 << 63) - 1) for i in range(args.chains * args.hashes)]
    push = ctx.socket(zmq.PUSH)
    push.setsockopt(zmq.LINGER, 2000)
    push.connect(f"tcp://{args.pull}")
    for seq, start in enumerate(range(0, len(keys), BATCH)):
        ops = [KVOpEvent(op_type=OpType.ADMIT, key=k, seq_num=seq * BATCH + j)
               for j, k in enumerate(keys[start:start + BATCH])]
        push.send(msgspec.msgpack.encode(BatchedKVOperationMsg(
            instance_id=holder, worker_id=0, location=LOCATION, operations=ops)))

    def chain(c: int) -> list[int]:
        return keys[c * args.hashes:(c + 1) * args.hashes]

    expected = (holder, LOCATION, args.hashes, peer_url)
    # PUSH and the reply ROUTER are separate sockets: wait until the last chain is indexed.
    last = msgspec.msgpack.encode(BatchedP2PLookupMsg(hashes=chain(args.chains - 1), instance_id=asker, worker_id=0))
    deadline = time.monotonic() + 30
    while True:
        ret = request(req, last)
        if isinstance(ret, BatchedP2PLookupRetMsg) and tuple(ret.layout_info[0]) == expected:
            break
        if time.monotonic() > deadline:
            raise SystemExit(f"keys not indexed after 30 s; last answer {ret!r}")
        time.sleep(0.01)

    total = args.warmup + args.requests
    payloads = [msgspec.msgpack.encode(BatchedP2PLookupMsg(
        hashes=chain(i % args.chains), instance_id=asker, worker_id=0)) for i in range(total)]
    before = loadavg()
    samples, answers = time_round_trips(req, payloads, args.warmup)
    after = loadavg()
    wrong = 0
    for raw in answers:
        ret = msgspec.msgpack.decode(raw, type=Msg)
        if not (isinstance(ret, BatchedP2PLookupRetMsg) and tuple(ret.layout_info[0]) == expected):
            wrong += 1

    push.send(msgspec.msgpack.encode(DeRegisterMsg(instance_id=holder, worker_id=0, ip="127.0.0.1", port=cmd_port)))
    push.close()  # lingers until the deregistration is sent
    req.close()
    cmd.close()
    ctx.term()
    report = {"what": "lookup", "classes": CLASSES, "hashes": args.hashes, "keys": len(keys), **summary(samples),
              "wrong_answers": wrong, "load_before": before, "load_after": after}
    return report


def echo_server(port_pipe, cpus) -> None:
    if cpus:
        os.sched_setaffinity(0, cpus)
    ctx = zmq.Context()
    s = ctx.socket(zmq.ROUTER)
    s.setsockopt(zmq.LINGER, 0)
    port_pipe.send(s.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        frames = s.recv_multipart()
        if frames[-1] == b"stop":
            return
        s.send_multipart(frames)


def echo(args) -> dict:
    """The floor: the same request bytes to a pyzmq ROUTER echo in another process."""
    parent, child = multiprocessing.Pipe()
    server = multiprocessing.get_context("fork").Process(
        target=echo_server, args=(child, args.server_cpus), daemon=True)
    server.start()
    port = parent.recv()
    ctx = zmq.Context()
    req = dealer(ctx, f"127.0.0.1:{port}")
    payload = msgspec.msgpack.encode(BatchedP2PLookupMsg(
        hashes=list(range(1 << 40, (1 << 40) + args.hashes)), instance_id="probe-asker", worker_id=0))
    before = loadavg()
    samples, answers = time_round_trips(req, [payload] * (args.warmup + args.requests), args.warmup)
    after = loadavg()
    wrong = sum(a != payload for a in answers)
    req.send_multipart([b"", b"stop"])
    server.join(5)
    req.close()
    ctx.term()
    return {"what": "echo", **summary(samples), "wrong_answers": wrong,
            "load_before": before, "load_after": after}


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def wait_tcp(port: int, proc: subprocess.Popen, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    raise SystemExit(f"nothing listens on {port} after {seconds} s")


def against_binary(args, binary: str, log) -> dict:
    http, pull, reply, hb = free_ports(4)
    ports = json.dumps({"pull": pull, "reply": reply, "heartbeat": hb})
    cpus = args.server_cpus
    proc = subprocess.Popen([binary, "serve", "--host", "127.0.0.1", "--port", str(http),
                             "--monitor-ports", ports], stdout=log, stderr=log,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)
    try:
        wait_tcp(reply, proc)
        wait_tcp(pull, proc)
        args.reply, args.pull = f"127.0.0.1:{reply}", f"127.0.0.1:{pull}"
        return lookup(args)
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def compare(args) -> list[dict]:
    builds = []
    for spec in args.builds:
        label, sep, binary = spec.partition("=")
        if not sep or not os.access(binary, os.X_OK):
            raise SystemExit(f"expected LABEL=EXECUTABLE, got {spec!r}")
        builds.append((label, binary))
    runs = []
    with tempfile.TemporaryFile() as log:
        for r in range(1, args.rounds + 1):
            for label, binary in [("echo", None)] + builds:
                rep = echo(args) if binary is None else against_binary(args, binary, log)
                rep.update(label=label, round=r)
                runs.append(rep)
                print(f"round {r} {label:>10}: p50 {rep['p50_us']:6.1f}  p90 {rep['p90_us']:6.1f}  "
                      f"p99 {rep['p99_us']:6.1f} us  wrong {rep['wrong_answers']}  "
                      f"load {rep['load_before']} -> {rep['load_after']}", file=sys.stderr, flush=True)
    return runs


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("mode", choices=["lookup", "echo", "compare"])
    p.add_argument("builds", nargs="*", help="compare: LABEL=KVPLANE_BIN")
    p.add_argument("--reply", default="127.0.0.1:8400")
    p.add_argument("--pull", default="127.0.0.1:8300")
    p.add_argument("--requests", type=int, default=20000)
    p.add_argument("--warmup", type=int, default=2000)
    p.add_argument("--hashes", type=int, default=100)
    p.add_argument("--chains", type=int, default=100)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", action="store_true")
    p.add_argument("--server-cpus", type=lambda v: {int(c) for c in v.split(",")}, default=None,
                   help="compare/echo: CPUs (comma-separated) the servers run on, e.g. 2,3; "
                        "pin the probe itself elsewhere with taskset")
    args = p.parse_intermixed_args()
    if min(args.requests, args.hashes, args.chains, args.rounds) < 1 or args.warmup < 0:
        p.error("--requests, --hashes, --chains and --rounds must be positive, --warmup not negative")
    if args.mode == "compare":
        if not args.builds:
            p.error("compare needs at least one LABEL=KVPLANE_BIN")
        runs = compare(args)
        table = {}
        for label in dict.fromkeys(r["label"] for r in runs):
            mine = [r for r in runs if r["label"] == label]
            table[label] = {k: statistics.median(r[k] for r in mine) for k in ("p50_us", "p90_us", "p99_us")}
            table[label]["p50_runs"] = [r["p50_us"] for r in mine]
        out = {"runs": runs, "medians": table}
        if args.json:
            print(json.dumps(out, indent=1))
        else:
            print("| label | p50 runs (us) | median p50 / p90 / p99 (us) |")
            print("|---|---|---|")
            for label, m in table.items():
                runs_s = ", ".join(f"{x:.1f}" for x in m["p50_runs"])
                print(f"| {label} | {runs_s} | {m['p50_us']:.1f} / {m['p90_us']:.1f} / {m['p99_us']:.1f} |")
        return 1 if any(r["wrong_answers"] for r in runs) else 0
    report = lookup(args) if args.mode == "lookup" else echo(args)
    if args.json:
        print(json.dumps(report))
    else:
        print(" ".join(f"{k}={v}" for k, v in report.items()))
    return 1 if report["wrong_answers"] else 0


if __name__ == "__main__":
    sys.exit(main())
