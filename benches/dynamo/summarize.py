#!/usr/bin/env python3
"""Medians of the `kvplane bench indexer --json` reports in DIR (indexer-FLAVOR-RUN.json).

usage: summarize.py DIR
"""
import glob, json, os, statistics, sys

out = sys.argv[1]
rows = {}
for path in sorted(glob.glob(os.path.join(out, "indexer-*.json"))):
    name = os.path.basename(path)[len("indexer-"):-len(".json")]
    flavor = name.rsplit("-", 1)[0]
    with open(path) as f:
        rows.setdefault(flavor, []).append(json.load(f))

def med(rs, key):
    vals = [key(r) for r in rs]
    vals = [v for v in vals if v is not None]
    return statistics.median(vals) if vals else float("nan")

print(f"{'flavor':<24}{'runs':>5}{'blocks':>10}{'events/s':>12}{'blocks/s':>12}"
      f"{'q p50 µs':>10}{'q p99 µs':>10}{'wrong':>7}{'B/memb':>8}{'peak MiB':>10}{'load':>12}")
for flavor, rs in rows.items():
    loads = [r["loadavg"][0] for r in rs if r["loadavg"][0] is not None]
    print(f"{flavor:<24}{len(rs):>5}{rs[0]['blocks']:>10}"
          f"{med(rs, lambda r: r['applied_events_per_sec']):>12.0f}"
          f"{med(rs, lambda r: r['applied_blocks_per_sec']):>12.0f}"
          f"{med(rs, lambda r: r['query']['p50_us']):>10.1f}"
          f"{med(rs, lambda r: r['query']['p99_us']):>10.1f}"
          f"{sum(r['wrong_answers'] for r in rs):>7}"
          f"{med(rs, lambda r: r['rss_bytes_per_membership']):>8.1f}"
          f"{med(rs, lambda r: r['rss_peak']) / 2**20:>10.1f}"
          f"{(min(loads) if loads else 0):>6.1f}-{(max(loads) if loads else 0):<5.1f}")
