"""Reads the raw lines of bench/crash/run.sh and prints the table of medians.

Each `crash target=T run=N key=value ...` line is one trial; the table gives per target the median
time from the restart to serving HTTP (Tidal: /healthz), to ready and to caught up, what the node
had to replay, and the ratio of each peer's median ready time to Tidal's (above 1: Tidal is back
sooner).
"""

import re
import statistics
import sys

# The least WAL replay (MB) whose rate is reported.
REPLAY_MB_MIN = 8.0


def trials(path):
    by_target = {}
    with open(path) as lines:
        for line in lines:
            if not line.startswith("crash "):
                continue
            pairs = dict(re.findall(r'(\w+)=("[^"]*"|\S+)', line))
            by_target.setdefault(pairs["target"], []).append(pairs)
    return by_target


def median(rows, key, scale=1.0):
    values = []
    for row in rows:
        try:
            values.append(float(row[key]) * scale)
        except (KeyError, ValueError):
            pass
    return statistics.median(values) if values else None


def show(value, digits=2):
    return "-" if value is None else f"{value:.{digits}f}"


def main(path):
    by_target = trials(path)
    print("| target | runs | ready s (each) | serving s | ready s | caught up s | replayed MB | WAL replay MB/s | engine open s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for target, rows in by_target.items():
        each = ", ".join(row["ready_s"] for row in rows)
        if target.startswith("tidal"):
            replayed = f"journal {show(median(rows, 'journal_bytes', 1e-6), 1)} + WAL {show(median(rows, 'replay_mb'), 1)}"
            # A replay of a few MB is its fixed costs: its rate says nothing.
            rates = [float(r["replay_mb"]) / float(r["replay_s"]) for r in rows
                     if r.get("replay_s", "0") not in ("0", "-") and float(r["replay_s"]) > 0
                     and float(r["replay_mb"]) >= REPLAY_MB_MIN]
            rate = show(statistics.median(rates), 0) if rates else "-"
            engine = show(median(rows, "engine_open_s"))
        elif target == "redis":
            replayed, rate, engine = f"AOF {show(median(rows, 'aof_bytes', 1e-6), 1)}", "-", "-"
        else:
            replayed = f"WAL {show(median(rows, 'wal_past_checkpoint_bytes', 1e-6), 1)}"
            rate, engine = "-", "-"
        print(f"| {target} | {len(rows)} | {each} | {show(median(rows, 'serving_s'))} | {show(median(rows, 'ready_s'))} | "
              f"{show(median(rows, 'caught_up_s'))} | {replayed} | {rate} | {engine} |")
    print()
    for tidal in ("tidal-leader", "tidal-follower"):
        ours = median(by_target.get(tidal, []), "ready_s")
        for peer in ("redis", "postgres"):
            theirs = median(by_target.get(peer, []), "ready_s")
            if ours and theirs:
                print(f"ready, {peer} / {tidal}: {theirs / ours:.2f}x (above 1: Tidal ready sooner)")
        caught = median(by_target.get(tidal, []), "caught_up_s")
        for peer in ("redis", "postgres"):
            theirs = median(by_target.get(peer, []), "caught_up_s")
            if caught and theirs:
                print(f"caught up, {peer} / {tidal}: {theirs / caught:.2f}x")


if __name__ == "__main__":
    main(sys.argv[1])
