"""Medians of scripts/bench-services.sh's raw reports, as Markdown tables.

Usage: summarize.py OUT_DIR {coordinator|node|node-py|all} RUNS
Reads OUT_DIR/{coord,node}-{kvplane,python,baseline}-R.json (kvplane bench --json),
OUT_DIR/node-py-{kvplane,kvplane-tasks,kvplane-prealloc,python}-R.json (benches/lmcache/node_py_client.py),
the .proc.json RSS readings and the .load.json load averages next to them.
"""

import json
import os
import statistics
import sys


def load(path):
    with open(path) as f:
        return json.load(f)


def med(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def runs_of(out, prefix, runs):
    found = []
    for r in range(1, runs + 1):
        path = os.path.join(out, f"{prefix}-{r}.json")
        if os.path.exists(path):
            rep = load(path)
            proc_path = os.path.join(out, f"{prefix}-{r}.proc.json")
            rep["_proc"] = load(proc_path) if os.path.exists(proc_path) else {}
            rep["_load"] = load(os.path.join(out, f"{prefix}-{r}.load.json"))
            found.append(rep)
    return found


def loads(reps):
    return "; ".join(f"{r['_load']['before']} → {r['_load']['after']}" for r in reps)


def coordinator(out, runs):
    rows = {}
    for who in ("kvplane", "python"):
        reps = runs_of(out, f"coord-{who}", runs)
        if not reps:
            continue
        rows[who] = {
            "n": len(reps),
            "events": med([r["events_per_sec"] for r in reps]),
            "all_events": [round(r["events_per_sec"]) for r in reps],
            "idle50": med([r["heartbeat_idle"]["p50_us"] for r in reps]),
            "idle99": med([r["heartbeat_idle"]["p99_us"] for r in reps]),
            "load50": med([r["heartbeat_loaded"]["p50_us"] for r in reps]),
            "load99": med([r["heartbeat_loaded"]["p99_us"] for r in reps]),
            "rss": med([r["_proc"].get("vmrss_kib") for r in reps]),
            "hwm": med([r["_proc"].get("vmhwm_kib") for r in reps]),
            "servers": reps[0]["servers"],
            "loads": loads(reps),
            "per_key": med([r.get("bytes_per_key") for r in reps if r.get("bytes_per_key")]),
            "register": med([r.get("register_seconds") for r in reps if r.get("register_seconds")]),
        }
    print("## coordinator (medians)\n")
    print("| coordinator | runs | applied events/s | heartbeat idle p50 / p99 (µs) "
          "| heartbeat under event load p50 / p99 (µs) | RSS / peak at end (MiB) "
          "| bytes per tracked key | registration of all servers (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for who, r in rows.items():
        print(f"| {who} | {r['n']} | {fmt(r['events'], ',.0f')} {r['all_events']} "
              f"| {fmt(r['idle50'], '.0f')} / {fmt(r['idle99'], '.0f')} "
              f"| {fmt(r['load50'], '.0f')} / {fmt(r['load99'], '.0f')} "
              f"| {fmt(r['rss'] and r['rss'] / 1024, '.1f')} / {fmt(r['hwm'] and r['hwm'] / 1024, '.1f')} "
              f"| {fmt(r['per_key'], ',.0f')} | {fmt(r['register'], '.2f')} |")
    if "kvplane" in rows and "python" in rows and rows["python"]["events"]:
        print(f"\nevent-rate ratio kvplane / python: "
              f"{rows['kvplane']['events'] / rows['python']['events']:.1f}×")
    for who, r in rows.items():
        print(f"load ({who}, 1/5/15 min before → after each run): {r['loads']}")
    print()


def node(out, runs):
    rows = []
    for who in ("kvplane", "kvplane-prealloc", "kvplane-rewrite", "python", "python-rewrite",
                "baseline", "baseline-keep"):
        reps = runs_of(out, f"node-{who}", runs)
        if not reps:
            continue
        for i, size in enumerate(reps[0]["sizes"]):
            s = [r["sizes"][i] for r in reps]
            rows.append({
                "who": who, "n": len(reps), "size": size["size"],
                "put": med([x["put"]["gb_per_sec"] for x in s]),
                "put50": med([x["put"]["latency"]["p50_us"] for x in s]),
                "put99": med([x["put"]["latency"]["p99_us"] for x in s]),
                "get": med([x["get"]["gb_per_sec"] for x in s]),
                "get50": med([x["get"]["latency"]["p50_us"] for x in s]),
                "get99": med([x["get"]["latency"]["p99_us"] for x in s]),
                "per_gib": med([x.get("rss_mib_per_stored_gib") for x in s]),
                "over": med([x.get("memory_overhead") for x in s]),
            })
        print(f"load (node {who}, before → after each run): {loads(reps)}")
    print("\n## node (medians)\n")
    print("| server | size | runs | PUT GB/s | PUT p50 / p99 (µs) | GET GB/s "
          "| GET p50 / p99 (µs) | RSS MiB per stored GiB | overhead |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        over = None if r["over"] is None else r["over"] * 100
        print(f"| {r['who']} | {r['size'] // 1024} KiB | {r['n']} | {fmt(r['put'], '.2f')} "
              f"| {fmt(r['put50'], '.0f')} / {fmt(r['put99'], '.0f')} | {fmt(r['get'], '.2f')} "
              f"| {fmt(r['get50'], '.0f')} / {fmt(r['get99'], '.0f')} "
              f"| {fmt(r['per_gib'], '.1f')} | {fmt(over, '.2f')}% |")
    by = {(r["who"], r["size"]): r for r in rows}
    for size in sorted({r["size"] for r in rows}):
        k, p, b = by.get(("kvplane", size)), by.get(("python", size)), by.get(("baseline", size))
        kk, kr = by.get(("baseline-keep", size)), by.get(("kvplane-rewrite", size))
        for op in ("put", "get"):
            parts = []
            if k and p and p[op]:
                parts.append(f"kvplane/python {k[op] / p[op]:.2f}×")
            if k and b and k[op]:
                parts.append(f"baseline/kvplane {b[op] / k[op]:.2f}×")
            if k and kk and k[op]:
                parts.append(f"baseline-keep/kvplane {kk[op] / k[op]:.2f}×")
            if kr and b and kr[op]:
                parts.append(f"baseline/kvplane-rewrite {b[op] / kr[op]:.2f}×")
            kp = by.get(("kvplane-prealloc", size))
            if kp and b and kp[op]:
                parts.append(f"baseline/kvplane-prealloc {b[op] / kp[op]:.2f}×")
            if kp and p and p[op]:
                parts.append(f"kvplane-prealloc/python {kp[op] / p[op]:.2f}×")
            print(f"{size // 1024} KiB {op.upper()}: " + ", ".join(parts))
    print()


def node_py(out, runs):
    rows = {}
    for who in ("kvplane", "kvplane-tasks", "kvplane-prealloc", "python"):
        reps = runs_of(out, f"node-py-{who}", runs)
        if not reps:
            continue
        rows[who] = {
            "n": len(reps),
            **{f"{op}_{k}": med([r[op][k] for r in reps])
               for op in ("put", "get") for k in ("gb_per_s", "p50_us", "p99_us")},
            "all": [(r["put"]["gb_per_s"], r["get"]["gb_per_s"], r["get"]["p99_us"]) for r in reps],
            "rss": med([r["_proc"].get("vmrss_kib") for r in reps]),
        }
        print(f"load (node-py {who}, before → after each run): {loads(reps)}")
    print("\n## node with the Python client (medians)\n")
    print("| server | runs | PUT GB/s | PUT p50 / p99 (µs) | GET GB/s | GET p50 / p99 (µs) "
          "| RSS at end (MiB) | every run (PUT GB/s, GET GB/s, GET p99 µs) |")
    print("|---|---|---|---|---|---|---|---|")
    for who, r in rows.items():
        print(f"| {who} | {r['n']} | {fmt(r['put_gb_per_s'], '.2f')} "
              f"| {fmt(r['put_p50_us'], '.0f')} / {fmt(r['put_p99_us'], '.0f')} "
              f"| {fmt(r['get_gb_per_s'], '.2f')} "
              f"| {fmt(r['get_p50_us'], '.0f')} / {fmt(r['get_p99_us'], '.0f')} "
              f"| {fmt(r['rss'] and r['rss'] / 1024, '.0f')} | {r['all']} |")
    p = rows.get("python")
    for who in ("kvplane", "kvplane-tasks", "kvplane-prealloc"):
        k = rows.get(who)
        if k and p:
            print(f"{who}/python: PUT {k['put_gb_per_s'] / p['put_gb_per_s']:.2f}×, "
                  f"GET {k['get_gb_per_s'] / p['get_gb_per_s']:.2f}×, "
                  f"GET p99 {k['get_p99_us'] / p['get_p99_us']:.2f}×")
    print()


def main():
    out, what, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
    print(f"# kvplane vs LMCache 0.5.6 ({runs} runs; raw reports in {out})\n")
    if what in ("coordinator", "all"):
        coordinator(out, runs)
    if what in ("node", "all"):
        node(out, runs)
    if what in ("node-py", "all"):
        node_py(out, runs)


if __name__ == "__main__":
    main()
