#!/usr/bin/env python3
"""Turns what postgres/run.sh collected into figures (standard library only).

  pgstats.py latency FILE...   pgbench per-transaction logs (-l): the third column is the
                               transaction's latency in microseconds -> count, p50/p99/max ms
  pgstats.py lag FILE          lines `replay_ms|flush_ms|write_ms|bytes_behind` sampled from
                               pg_stat_replication -> p50/p99/max of each
Each prints one line of key=value pairs.
"""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "lib"))
from stats import quantile  # noqa: E402


def latency(paths):
    millis = []
    for path in paths:
        with open(path) as log:
            for line in log:
                columns = line.split()
                if len(columns) >= 3 and columns[2].isdigit():
                    millis.append(int(columns[2]) / 1000)
    millis.sort()
    print(f"transactions={len(millis)} p50_ms={quantile(millis, .5):.3f} p99_ms={quantile(millis, .99):.3f} "
          f"max_ms={(millis[-1] if millis else float('nan')):.3f}")


def lag(path):
    names = ("replay", "flush", "write", "bytes")
    series = {name: [] for name in names}
    samples = 0
    with open(path) as sampled:
        for line in sampled:
            values = line.strip().split("|")
            if len(values) != len(names):
                continue
            samples += 1
            for name, value in zip(names, values):
                if value:
                    series[name].append(float(value))
    pairs = {"samples": samples}
    for name in names[:3]:
        xs = sorted(series[name])
        pairs[f"{name}_n"] = len(xs)
        pairs[f"{name}_p50_ms"] = f"{quantile(xs, .5):.2f}"
        pairs[f"{name}_p99_ms"] = f"{quantile(xs, .99):.2f}"
        pairs[f"{name}_max_ms"] = f"{(xs[-1] if xs else float('nan')):.2f}"
    pairs["bytes_behind_max"] = f"{max(series['bytes'], default=float('nan')):.0f}"
    print(" ".join(f"{key}={value}" for key, value in pairs.items()))


if __name__ == "__main__":
    words = sys.argv[1:]
    if words[:1] == ["latency"] and len(words) > 1:
        latency(words[1:])
    elif words[:1] == ["lag"] and len(words) == 2:
        lag(words[1])
    else:
        sys.exit(__doc__)
