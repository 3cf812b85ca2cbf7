#!/usr/bin/env python3
"""Turns what postgres/run.sh collected into figures (standard library only).

  pgstats.py latency FILE...   pgbench per-transaction logs (-l): the third column is the
                               transaction's latency in microseconds -> count, p50/p99/max ms
  pgstats.py lag FILE          lines `replay_ms|flush_ms|write_ms|bytes_behind` sampled from
                               pg_stat_replication -> p50/p99/max of each
Each prints one line of key=value pairs.
"""
import sys


def quantile(sorted_values, q):
    if not sorted_values:
        return float("nan")
    rank = -(-round(q * 1000) * len(sorted_values) // 1000)
    return sorted_values[max(1, min(rank, len(sorted_values))) - 1]


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
    out = [f"samples={samples}"]
    for name in names[:3]:
        xs = sorted(series[name])
        out.append(f"{name}_n={len(xs)} {name}_p50_ms={quantile(xs, .5):.2f} {name}_p99_ms={quantile(xs, .99):.2f} "
                   f"{name}_max_ms={(xs[-1] if xs else float('nan')):.2f}")
    behind = sorted(series["bytes"])
    out.append(f"bytes_behind_max={(behind[-1] if behind else float('nan')):.0f}")
    print(" ".join(out))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "latency":
        latency(sys.argv[2:])
    elif len(sys.argv) == 3 and sys.argv[1] == "lag":
        lag(sys.argv[2])
    else:
        sys.exit(__doc__)
