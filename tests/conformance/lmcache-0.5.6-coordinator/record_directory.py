"""Records LMCache 0.5.6's coordinator answers to a fixed /directory scenario.

Run against a real `lmcache coordinator --host 127.0.0.1 --port PORT --chunk-size 16
--enable-blend-lookup --eviction-check-interval 0 --health-check-interval 0` (lmcache 0.5.6):

    python record_directory.py http://127.0.0.1:PORT > directory_exchanges.json

Writes [{"method", "path", "body", "status", "answer"}] for every request, events included,
so tests/coordinator/directory.rs replays the same requests against kvplane and compares.
Needs only the standard library and blake3 (the token hashes are LMCache's rolling BLAKE3).
"""

import base64
import json
import struct
import sys
import urllib.request

import blake3

BASE = sys.argv[1]
CHUNK = 16


def chunk_hashes(tokens):
    prefix = blake3.blake3(struct.pack(">q", 0) + struct.pack(">I", 0)).digest()
    out = []
    for i in range(0, len(tokens) - len(tokens) % CHUNK, CHUNK):
        h = blake3.blake3(prefix)
        for t in tokens[i : i + CHUNK]:
            h.update(struct.pack(">I", t))
        prefix = h.digest()
        out.append(prefix.hex())
    return out


def key(hex_, rank=16777472, salt="", group=0, model="m"):
    return {"chunk_hash_hex": hex_, "model_name": model, "kv_rank": rank,
            "object_group_id": group, "cache_salt": salt}


def batch(inst, inc, seq, ev, tier, backend, entries, shared=False):
    return {"instance_id": inst, "incarnation": inc, "seq": seq, "event_type": ev,
            "tier": tier, "backend": backend, "entries": entries, "shared": shared,
            "ts": 1.0, "capacity_bytes": 0, "capacity_revision": 0}


def entry(k, size=0, tokens=(), offset=-1):
    return {"key": k, "size_bytes": size, "token_ids": list(tokens), "token_offset": offset}


SEQ = list(range(100, 148))  # three chunks of 16
H = chunk_hashes(SEQ)
AA = {"chunk_hash_hex": "aa", "model_name": "m", "kv_rank": 0, "cache_salt": "user-a"}

requests = [
    ("POST", "/events", {"batches": [batch("probe", 1, 1, "store", "l2", "fs", [entry(AA, 10)])]}),
    ("POST", "/events", {"batches": [batch("probe2", 1, 1, "store", "l2", "fs", [entry(AA, 5)])]}),
    ("POST", "/events", {"batches": [batch("probe", 1, 2, "access", "l2", "fs", [entry(AA)])]}),
    ("POST", "/events", {"batches": [
        batch("mp-a", 7, 1, "config", "l1", "dram", []),
        batch("mp-a", 7, 2, "store", "l1", "dram",
              [entry(key(h), 16384, SEQ[i * CHUNK:(i + 1) * CHUNK], i * CHUNK) for i, h in enumerate(H)]),
        batch("mp-a", 7, 3, "store", "l2", "fs",
              [entry(key(h), 16384, SEQ[i * CHUNK:(i + 1) * CHUNK], i * CHUNK) for i, h in enumerate(H[:2])]),
        batch("mp-a", 7, 4, "store", "l2", "nfs", [entry(key(H[0], group=1), 8192)], shared=True),
        batch("mp-a", 7, 5, "access", "l1", "", [entry(key(H[0])), entry(key(H[1]))]),
    ]}),
    ("POST", "/events", {"batches": [batch("mp-b", 3, 1, "store", "l2", "nfs", [entry(key(H[0], group=1), 8000)], shared=True),
                                     batch("mp-b", 3, 2, "store", "l2", "fs", [entry(key(H[2], salt="t2"), 100, SEQ[32:48], 32)])]}),
    ("GET", "/directory/stats", None),
    ("GET", "/directory/keys", None),
    ("GET", "/directory/keys?limit=2", None),
    ("GET", "/directory/keys?offset=1&limit=1", None),
    ("GET", "/directory/keys?tier=l1", None),
    ("GET", "/directory/keys?tier=l2&instance_id=probe", None),
    ("GET", "/directory/keys?backend=nfs", None),
    ("GET", "/directory/keys?instance_id=nobody", None),
    ("GET", "/directory/keys?limit=0", None),
    ("GET", "/directory/keys?limit=10001", None),
    ("GET", "/directory/keys?offset=-1", None),
    ("GET", "/directory/keys?tier=L2", None),
    ("POST", "/directory/lookup", {"keys": [AA, {"chunk_hash_hex": "AA", "model_name": "m", "kv_rank": 0, "cache_salt": "user-a"}, key("bb")]}),
    ("POST", "/directory/lookup", {"token_ids": SEQ + [1, 2], "model_name": "m"}),
    ("POST", "/directory/lookup", {"token_ids": SEQ[:16], "model_name": "m", "world_size": 2}),
    ("POST", "/directory/lookup", {"token_ids": SEQ[:16], "model_name": "m", "cache_salt": "t2"}),
    ("POST", "/directory/lookup", {"keys": [AA], "token_ids": [1]}),
    ("POST", "/directory/lookup", {}),
    ("POST", "/directory/lookup", {"token_ids": [1, 2]}),
    ("POST", "/directory/lookup", {"token_ids": [1], "model_name": "m", "world_size": 0}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": base64.b64encode(struct.pack("<19I", 5, 6, 7, *SEQ[16:32])).decode(), "model_name": "m"}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": base64.b64encode(struct.pack("<50I", 9, 9, *SEQ)).decode(), "model_name": "m"}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": base64.b64encode(struct.pack("<50I", 9, 9, *SEQ)).decode(), "model_name": "m", "cache_salt": "t2"}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": base64.b64encode(struct.pack("<16I", *SEQ[:16])).decode(), "model_name": "m", "world_size": 2}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": "", "model_name": ""}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": "AAAA", "model_name": "m"}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": "AAA", "model_name": "m"}),
    ("POST", "/directory/blend-lookup", {"tokens_b64": "AAAAAA=="}),
    # mp-a restarts (a newer incarnation): its L1 placements are fenced, L2 stays.
    ("POST", "/events", {"batches": [batch("mp-a", 8, 1, "config", "l1", "dram", [])]}),
    ("POST", "/events", {"batches": [batch("probe2", 1, 2, "delete", "l2", "fs", [entry(AA)])]}),
    ("DELETE", "/instances/mp-b", None),
    ("GET", "/directory/stats", None),
    ("GET", "/directory/keys", None),
]

out = []
for method, path, body in requests:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(BASE + path, data=data, method=method,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req) as r:
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    answer = json.loads(raw) if raw else None
    out.append({"method": method, "path": path, "body": body, "status": status, "answer": answer})
json.dump(out, sys.stdout, indent=1)
sys.stdout.write("\n")
