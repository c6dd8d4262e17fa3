#!/usr/bin/env python3
"""Writes the seed corpora of the fuzz targets from the LMCache 0.5.6 golden vectors.

    python3 fuzz/make_seeds.py [tests/conformance/lmcache-0.5.6/controller_messages.jsonl]

Seeds go to fuzz/corpus/<target>/seed-*; files already there (found by earlier runs) stay.
Standard library only.
"""

import json
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_VECTORS = os.path.join(
    HERE, "..", "tests", "conformance", "lmcache-0.5.6", "controller_messages.jsonl"
)

# Messages that arrive on a ROUTER socket (the rest go to PULL or are replies/commands).
REQUESTS = {
    "RegisterMsg",
    "HeartbeatMsg",
    "BatchedP2PLookupMsg",
    "FullSyncStartMsg",
    "FullSyncStatusMsg",
}


def js(value):
    return json.dumps(value).encode()


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def record(kind, data):
    """One pull_frames record: [kind][u16 LE length][bytes]."""
    return bytes([kind]) + struct.pack("<H", len(data)) + data


def pack(v):
    """A minimal msgpack encoder (maps, str, int, float, bool, None, lists), smallest forms."""
    if v is None:
        return b"\xc0"
    if v is True:
        return b"\xc3"
    if v is False:
        return b"\xc2"
    if isinstance(v, int):
        if 0 <= v < 128:
            return bytes([v])
        if -32 <= v < 0:
            return struct.pack("b", v)
        if v >= 0:
            for marker, fmt, top in ((0xCC, ">B", 1 << 8), (0xCD, ">H", 1 << 16),
                                     (0xCE, ">I", 1 << 32), (0xCF, ">Q", 1 << 64)):
                if v < top:
                    return bytes([marker]) + struct.pack(fmt, v)
        for marker, fmt, bits in ((0xD0, ">b", 7), (0xD1, ">h", 15), (0xD2, ">i", 31), (0xD3, ">q", 63)):
            if v >= -(1 << bits):
                return bytes([marker]) + struct.pack(fmt, v)
        raise ValueError(v)
    if isinstance(v, float):
        return b"\xcb" + struct.pack(">d", v)
    if isinstance(v, str):
        b = v.encode()
        if len(b) < 32:
            return bytes([0xA0 | len(b)]) + b
        return b"\xd9" + bytes([len(b)]) + b if len(b) < 256 else b"\xda" + struct.pack(">H", len(b)) + b
    if isinstance(v, (list, tuple)):
        head = bytes([0x90 | len(v)]) if len(v) < 16 else b"\xdc" + struct.pack(">H", len(v))
        return head + b"".join(pack(x) for x in v)
    if isinstance(v, dict):
        head = bytes([0x80 | len(v)]) if len(v) < 16 else b"\xde" + struct.pack(">H", len(v))
        return head + b"".join(pack(k) + pack(x) for k, x in v.items())
    raise TypeError(v)


# Example values for the field types of src/protocol/messages.rs.
EXAMPLES = {
    "String": "vllm-0",
    "i64": 3,
    "bool": True,
    "f64": 0.5,
    "ChunkHash": -9223372036854775552,
    "Option<String>": "127.0.0.1:7000",
    "Option<bool>": True,
    "Option<Vec<i64>>": [1, 2, 3],
    "Vec<i64>": [1, 2],
    "Vec<ChunkHash>": [1, -2, 18446744073709551600],
    "Vec<KVOpEvent>": [{"op_type": "admit", "key": 7, "seq_num": 0},
                       {"op_type": "evict", "key": 18446744073709551600, "seq_num": 1}],
    "(String, String)": ["127.0.0.1:7000", "LocalCPUBackend"],
    "IndexMap<String, String>": {"heartbeat_url": "127.0.0.1:8082"},
    "IndexMap<String, (String, i64)>": {"vllm-0": ["LocalCPUBackend", 256]},
    "IndexMap<i64, i64>": {0: 0, 1: -1},
    "Vec<HeartbeatCommand>": [{"command_type": "full_sync", "reason": "x", "args": None}],
    "Vec<(String, String, i64, String)>": [["vllm-0", "LocalCPUBackend", 2, "h:1"]],
    "Vec<WorkerInfo>": [{"instance_id": "vllm-0", "worker_id": 0, "ip": "10.0.0.5", "port": 8500,
                         "peer_init_url": None, "registration_time": 1.5,
                         "last_heartbeat_time": 2.5}],
}


def split_top_level(body):
    """Splits `a: X<Y, Z>, b: (P, Q)` at the commas outside brackets."""
    parts, depth, cur = [], 0, ""
    for ch in body:
        depth += ch in "<(" and 1 or 0
        depth -= ch in ">)" and 1 or 0
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in parts + [cur] if p.strip()]


def every_message_type():
    """One example of each of the 51 messages, from the table in src/protocol/messages.rs."""
    import re
    src = open(os.path.join(HERE, "..", "src", "protocol", "messages.rs")).read()
    table = src[src.index("messages! {"):]
    out = []
    for name, body in re.findall(r"^    (\w+) \{(.*)\}$", table, re.M):
        body = re.sub(r"#\[[^\]]*\]", "", body)
        msg = {"type": name}
        for field in split_top_level(body):
            fname, fty = (part.strip() for part in field.split(":", 1))
            msg[fname] = EXAMPLES[fty]
        out.append(msg)
    return out


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else DEFAULT_VECTORS
    with open(path) as f:
        vectors = [json.loads(line) for line in f if line.strip()]

    # decode: every vector, as msgpack and as JSON.
    for v in vectors:
        name = v["name"].replace("/", "_")
        write("decode", name + ".msgpack", bytes.fromhex(v["msgpack_hex"]))
        write("decode", name + ".json", json.dumps(v["value"]).encode())

    # decode: every one of the 51 message types, in both encodings.
    for msg in every_message_type():
        write("decode", "type-%s.msgpack" % msg["type"], pack(msg))
        write("decode", "type-%s.json" % msg["type"], js(msg))

    # pull_frames: each vector on its socket, then whole worker lifecycles.
    by_type = {}
    for v in vectors:
        by_type.setdefault(v["type"], []).append(v)
    for v in vectors:
        data = bytes.fromhex(v["msgpack_hex"])
        kind = 2 if v["type"] in REQUESTS else 1
        write("pull_frames", v["name"] + ".single", record(kind, data))

    def frames(t):
        return [bytes.fromhex(v["msgpack_hex"]) for v in by_type.get(t, [])]

    lifecycle = b""
    for reg in frames("RegisterMsg"):
        lifecycle += record(2, reg)
    for hb in frames("HeartbeatMsg"):
        lifecycle += record(3, hb)
    batch = frames("BatchedKVOperationMsg")
    for b in batch:
        lifecycle += record(0, b)
    lifecycle += record(1, b"")
    for t in ("FullSyncStartMsg",):
        for f in frames(t):
            lifecycle += record(2, f)
    for t in ("FullSyncBatchMsg", "FullSyncEndMsg"):
        for f in frames(t):
            lifecycle += record(0, f)
    lifecycle += record(1, b"")
    for f in frames("FullSyncStatusMsg") + frames("BatchedP2PLookupMsg"):
        lifecycle += record(2, f)
    lifecycle += record(4, b"\x00") + record(4, b"\x01")
    for f in frames("DeRegisterMsg"):
        lifecycle += record(1, f)
    write("pull_frames", "lifecycle", lifecycle)

    # The same story in JSON frames, with two workers sharing chunks and a reap at the end.
    story = b""
    for inst in ("a", "b"):
        story += record(2, js({"type": "RegisterMsg", "instance_id": inst, "worker_id": 0,
                               "ip": "127.0.0.1", "port": 9, "peer_init_url": inst + ":1"}))
        ops = [{"op_type": "admit", "key": k, "seq_num": i} for i, k in enumerate([1, 2, 3, -1, 2**64 - 1])]
        ops.append({"op_type": "evict", "key": 2, "seq_num": 7})
        story += record(1, js({"type": "BatchedKVOperationMsg", "instance_id": inst, "worker_id": 0,
                               "location": "LocalCPUBackend", "operations": ops}))
    story += record(2, js({"type": "BatchedP2PLookupMsg", "hashes": [1, 2, 3], "instance_id": "a", "worker_id": 0}))
    story += record(2, js({"type": "FullSyncStartMsg", "instance_id": "a", "worker_id": 0,
                           "location": "LocalCPUBackend", "sync_id": "s", "total_keys": 3, "batch_count": 2}))
    story += record(0, js({"type": "FullSyncBatchMsg", "instance_id": "a", "worker_id": 0,
                           "location": "LocalCPUBackend", "sync_id": "s", "batch_id": 1, "keys": [5, 6]}))
    story += record(1, js({"type": "FullSyncEndMsg", "instance_id": "a", "worker_id": 0,
                           "location": "LocalCPUBackend", "sync_id": "s", "actual_total_keys": 3}))
    story += record(4, b"\x01") + record(3, js({"type": "HeartbeatMsg", "instance_id": "a", "worker_id": 0,
                                                 "ip": "127.0.0.1", "port": 9, "peer_init_url": None}))
    story += record(4, b"\x02") + record(4, b"\x00")
    write("pull_frames", "story-json", story)

    # Past the target's limits: 8 workers (limit 6), 30 keys (limit 24), 50 ops (limit 40).
    limits = b""
    for i in range(8):
        limits += record(2, js({"type": "RegisterMsg", "instance_id": "w%d" % i, "worker_id": 0,
                                "ip": "127.0.0.1", "port": 9, "peer_init_url": None}))
    ops = [{"op_type": "admit", "key": k, "seq_num": k} for k in range(30)]
    limits += record(1, js({"type": "BatchedKVOperationMsg", "instance_id": "w0", "worker_id": 0,
                            "location": "LocalCPUBackend", "operations": ops}))
    ops = [{"op_type": "evict", "key": k, "seq_num": 30 + k} for k in range(50)]
    limits += record(1, js({"type": "BatchedKVOperationMsg", "instance_id": "w0", "worker_id": 0,
                            "location": "LocalCPUBackend", "operations": ops}))
    write("pull_frames", "limits-json", limits)

    # http_bodies: [route index][flags][body]. Route order is kvplane::http::api_routes().
    bodies = [
        (0, {"tokens": [1, 2, 3]}),
        (0, {"hashes": [1, -2, 18446744073709551615]}),
        (1, {"ip": "127.0.0.1"}),
        (2, {"instance_id": "a", "worker_ids": [0, 1]}),
        (3, {"instance_id": "a", "location": "LocalCPUBackend"}),
        (4, {"instance_id": "a", "location": "LocalCPUBackend", "tokens": [1, 2]}),
        (5, {"instance_id": "a", "method": "zstd", "location": "LocalCPUBackend", "tokens": None}),
        (6, {"instance_id": "a", "method": "zstd", "location": "LocalCPUBackend"}),
        (7, {"old_position": ["a", "LocalCPUBackend"], "new_position": ["b", "LocalCPUBackend"],
             "tokens": [1], "copy": True}),
        (8, {"instance_id": "a"}),
        (9, {"event_id": "x"}),
    ]
    for i, (route, body) in enumerate(bodies):
        for flags in (0, 1):
            write("http_bodies", "body-%d-%d" % (i, flags), bytes([route, flags]) + js(body))
    for route, query in ((11, "instance_id=a"), (11, "instance_id=a&worker_id=0"), (10, "")):
        write("http_bodies", "query-%d-%s" % (route, query.replace("&", "_").replace("=", "-")),
              bytes([route, 0]) + query.encode())


if __name__ == "__main__":
    main()
