"""A Python load generator for an ``lm://`` server that frames requests as LMCache 0.5.6's
``LMCServerConnector`` does: the header is LMCache's own ``ClientMetaMessage.serialize()``,
a PUT is ``sendall(header)`` then ``sendall(body)`` (no reply), a GET is ``sendall(header)``,
one ``recv(36)`` for LMCache's ``ServerMetaMessage``, then ``recv_into`` a preallocated
buffer until the body is in (the connector's ``receive_all``). Blocking sockets with default
options, one connection per client process, as one connector per worker.

Usage: node_py_client.py HOST PORT [--clients 4] [--size 2097152] [--bytes-per-client N]
       [--seed S]
Prints one JSON object: PUT and GET GB/s (bytes / wall time of the phase over all clients,
1 GB = 1e9 bytes) and per-op p50 / p99 / max latency in microseconds. Every GET body is
checked (length, first and last 4 KiB). Needs a venv with lmcache 0.5.6 and torch
(the MP fleet venv, scripts/setup-mp-fleet.sh).
"""

import argparse
import json
import multiprocessing as mp
import os
import socket
import sys
import time

import torch
from lmcache.utils import CacheEngineKey
from lmcache.v1.memory_management import MemoryFormat
from lmcache.v1.protocol import (
    ClientCommand,
    ClientMetaMessage,
    ServerMetaMessage,
    ServerReturnCode,
)

SHAPE = torch.Size([2, 32, 256, 128])  # 2 MiB of float16 at 256 tokens (not checked)


def key(seed, client, i):
    return CacheEngineKey("bench-py", 1, 0, (seed << 40) | (client << 24) | i, torch.float16)


def header(cmd, k, length):
    return ClientMetaMessage(
        cmd, k, length, MemoryFormat(1), torch.float16, SHAPE if length else torch.Size([0, 0, 0, 0])
    ).serialize()


def recv_exact(sock, n):
    data = bytearray()
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            raise ConnectionError("server closed")
        data += part
    return bytes(data)


def client(args, c, barrier, out):
    rng_body = bytearray(os.urandom(args.size))
    n = args.bytes_per_client // args.size
    sock = socket.create_connection((args.host, args.port))
    reply_len = ServerMetaMessage.packlength()
    put_lat, get_lat, short_headers = [], [], 0
    barrier.wait()
    t_put0 = time.perf_counter()
    for i in range(n):
        rng_body[0:8] = i.to_bytes(8, "little")
        t0 = time.perf_counter()
        sock.sendall(header(ClientCommand.PUT, key(args.seed, c, i), args.size))
        sock.sendall(rng_body)
        put_lat.append(time.perf_counter() - t0)
    # The PUT phase ends when the last PUT is stored: a connection is served in order.
    sock.sendall(header(ClientCommand.EXIST, key(args.seed, c, n - 1), 0))
    meta = ServerMetaMessage.deserialize(recv_exact(sock, reply_len))
    assert meta.code == ServerReturnCode.SUCCESS, "last PUT not stored"
    t_put1 = time.perf_counter()
    barrier.wait()
    buf = bytearray(args.size)
    view = memoryview(buf)
    t_get0 = time.perf_counter()
    for i in range(n):
        t0 = time.perf_counter()
        sock.sendall(header(ClientCommand.GET, key(args.seed, c, i), 0))
        data = sock.recv(reply_len)  # what the connector does: one recv for the header
        if len(data) < reply_len:
            short_headers += 1
            data += recv_exact(sock, reply_len - len(data))
        meta = ServerMetaMessage.deserialize(data)
        assert meta.code == ServerReturnCode.SUCCESS, f"GET {i} missed"
        assert meta.length == args.size, f"GET {i}: {meta.length} bytes"
        got = 0
        while got < meta.length:
            r = sock.recv_into(view[got:], meta.length - got)
            if r == 0:
                raise ConnectionError("server closed mid-body")
            got += r
        get_lat.append(time.perf_counter() - t0)
        assert buf[0:8] == i.to_bytes(8, "little") and buf[8:4096] == rng_body[8:4096]
        assert buf[-4096:] == rng_body[-4096:]
    t_get1 = time.perf_counter()
    sock.close()
    out.put(
        {
            "put": (t_put0, t_put1, put_lat),
            "get": (t_get0, t_get1, get_lat),
            "bytes": n * args.size,
            "short_headers": short_headers,
        }
    )


def pct(xs, q):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] * 1e6


def main():
    p = argparse.ArgumentParser()
    p.add_argument("host")
    p.add_argument("port", type=int)
    p.add_argument("--clients", type=int, default=4)
    p.add_argument("--size", type=int, default=2 << 20)
    p.add_argument("--bytes-per-client", type=int, default=256 << 20)
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args()
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(args.clients)
    out = ctx.Queue()
    procs = [ctx.Process(target=client, args=(args, c, barrier, out)) for c in range(args.clients)]
    for pr in procs:
        pr.start()
    results = [out.get(timeout=600) for _ in procs]
    for pr in procs:
        pr.join(timeout=60)
        if pr.exitcode != 0:
            sys.exit(f"a client failed (exit {pr.exitcode})")
    report = {"clients": args.clients, "size": args.size}
    total = sum(r["bytes"] for r in results)
    for phase in ("put", "get"):
        start = min(r[phase][0] for r in results)
        end = max(r[phase][1] for r in results)
        lat = [x for r in results for x in r[phase][2]]
        report[phase] = {
            "gb_per_s": round(total / (end - start) / 1e9, 3),
            "p50_us": round(pct(lat, 0.50)),
            "p99_us": round(pct(lat, 0.99)),
            "max_us": round(max(lat) * 1e6),
            "ops": len(lat),
        }
    report["short_headers"] = sum(r["short_headers"] for r in results)
    print(json.dumps(report))


if __name__ == "__main__":
    main()
