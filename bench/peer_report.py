#!/usr/bin/env python3
"""Tidal vs peers: reads this sitting's figures and writes REPORT.md and ratios.svg.

Inputs (all from the same `make bench-peers` run):
  --tidal-bench FILE   rows printed by `tidal bench` (markdown table rows): items, signals, the
                       stream workloads publish (batch 1 and 100), stream-lag and stream-read, and
                       the inbox workloads inbox-roundtrip (1 and 16), inbox-latency and inbox-drain
                       (rows absent: their figures are "-")
  --tidal-gates FILE   `tidal gates --results FILE` key=value lines (replication-lag, heal-100k)
  --tidal-leader-bench FILE  (optional) `tidal bench` rows against a `--durability leader` cluster:
                       acknowledged after the leader's fsync, the promise Redis `appendfsync always`
                       with async replicas makes, so that row is set against Redis
  --anchors DIR        the peer scripts' results folder (bench/peers, in its writable copy);
                       the newest run-*/ holding each peer is used
  --out DIR            where REPORT.md and ratios.svg go

Every ratio is written so that > 1 means Tidal is ahead: throughput is Tidal / peer, latency,
lag and catch-up time are peer / Tidal. A figure that is missing is shown as "-", never guessed.
Standard library only.
"""

import argparse
import math
import pathlib
import re
import sys


def table_rows(text, header_prefix):
    """Rows (lists of cells) of the first markdown table whose header starts with header_prefix."""
    rows, inside = [], False
    for line in text.splitlines():
        if not inside:
            if line.startswith("| " + header_prefix):
                inside = True
            continue
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(set(c) <= set("-:") for c in cells):
            continue
        rows.append(cells)
    return rows


def number(cell):
    match = re.search(r"-?\d+(\.\d+)?", cell or "")
    return float(match.group(0)) if match else None


def newest(anchors, peer):
    """Text of the newest run-*/<peer>.txt that holds a result table, or ''."""
    for run in sorted(pathlib.Path(anchors).glob("run-*"), reverse=True):
        path = run / f"{peer}.txt"
        if path.exists() and "\n== " in path.read_text(errors="replace"):
            return path.read_text(errors="replace"), str(path)
    return "", None


LEADER = " (leader durability)"


def text_of(path):
    """The file's text, or '' (with a note on stderr) when it is missing: its figures become "-"."""
    try:
        return pathlib.Path(path).read_text(errors="replace")
    except FileNotFoundError:
        print(f"peer_report: {path} is missing; its figures are shown as -", file=sys.stderr)
        return ""


def tidal_figures(bench_file, gates_file, leader_bench_file=None):
    figures = bench_figures(bench_file, "")
    if leader_bench_file:
        figures.update(bench_figures(leader_bench_file, LEADER))
    gates = {}
    for line in text_of(gates_file).splitlines():
        if not line.split():
            continue
        name, *pairs = line.split()
        gates[name] = dict(pair.split("=", 1) for pair in pairs if "=" in pair)
    return figures, gates


def workload_key(name):
    """A workload's name as `tidal bench` may print it (`Items`, `stream-lag`, `StreamLag`), folded."""
    return re.sub(r"[^a-z0-9]", "", name.lower())


def bench_figures(bench_file, suffix):
    """{(folded workload + suffix, clients, batch): figures} from the rows `tidal bench` printed."""
    figures = {}
    for line in text_of(bench_file).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 11 or cells[0] in ("workload",) or cells[0].startswith("-"):
            continue
        workload, concurrency, batch = cells[0], int(cells[1]), int(cells[2])
        errors = int(cells[4])
        entry = {"rps": float(cells[6]), "eps": float(cells[7]), "p50": float(cells[8]),
                 "p99": float(cells[9]), "errors": errors, "batch": batch, "workload": workload + suffix,
                 "seconds": float(cells[5])}
        figures[(workload_key(workload) + suffix, concurrency, batch)] = entry
    # inbox-drain's own table: the preloaded drain (the last cell, ms) goes onto its row.
    for line in text_of(bench_file).splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 9 and workload_key(cells[0]) == "inboxdrain":
            for (key, _, _), entry in figures.items():
                if key == "inboxdrain" + suffix:
                    entry["preloaded_s"] = number(cells[8]) / 1000.0 if number(cells[8]) is not None else None
    return figures


def tidal_row(figures, workload, concurrency, batch=None):
    """The row of that workload (any spelling), concurrency (None: any) and batch (None: any batch),
    or None."""
    suffix = LEADER if workload.endswith(LEADER) else ""
    name = workload_key(workload[: len(workload) - len(suffix)]) + suffix
    for (key, clients, rows_batch), entry in sorted(figures.items()):
        if key == name and concurrency in (None, clients) and batch in (None, rows_batch):
            return entry
    return None


def peer_figures(anchors):
    peers, sources = {}, {}
    text, sources["redis"] = newest(anchors, "redis")
    if text:
        redis = {}
        for row in table_rows(text, "workload | pipeline"):
            if row[0] == "SET 100 B":
                redis[("set", int(row[1]))] = {"ops": number(row[3]), "p50": number(row[4]), "p99": number(row[5])}
        for row in table_rows(text, "replication lag"):
            if row[0].startswith("visible after ack"):
                p50, p99, _ = (number(x) for x in row[1].split("/"))
                redis["lag"] = (p50, p99)
        for row in table_rows(text, "catch-up mode"):
            if row[0] == "restart" and row[1] == "1mb":
                redis["catchup"] = number(row[5])
        for row in table_rows(text, "stream publish"):
            redis[("xadd", int(row[1]), int(row[2]))] = {"ops": number(row[3]), "p50": number(row[4]),
                                                         "p99": number(row[5])}
        for row in table_rows(text, "stream delivery"):
            if row[0].startswith("on every replica"):
                p50, p99, _ = (number(x) for x in row[1].split("/"))
                redis["delivery"] = (p50, p99)
        for row in table_rows(text, "stream read"):
            redis[("xrange", int(row[1]))] = {"ops": number(row[3]), "p50": number(row[4]), "p99": number(row[5])}
        redis.update(queue_figures(text))
        peers["redis"] = redis
    text, sources["postgres"] = newest(anchors, "postgres")
    if text:
        pg = {}
        for row in table_rows(text, "replica mode"):
            lag = [number(x) for x in row[6].split("/")]
            pg[(row[0], int(row[1]))] = {"ops": number(row[2]), "p50": number(row[3]), "p99": number(row[4]),
                                        "lag": (lag[0], lag[1])}
        for row in table_rows(text, "catch-up"):
            if row[0].startswith("restart -> replayed"):
                pg["catchup"] = number(row[1])
        peers["postgres"] = pg
    text, sources["nats"] = newest(anchors, "nats")
    if text:
        nats = {}
        for row in table_rows(text, "stream | publishers"):
            if row[0] == "R3 file" and row[3] == "no":
                # (publishers, in flight each, batch awaited together); tables before the batch
                # column had only single publishes
                batch = int(row[9]) if len(row) > 9 else 1
                nats[(int(row[1]), int(row[2]), batch)] = {"ops": number(row[4]), "p50": number(row[5]),
                                                           "p99": number(row[6])}
        nats.update(queue_figures(text))
        peers["nats"] = nats
    text, sources["etcd"] = newest(anchors, "etcd")
    if text:
        etcd = {}
        for row in table_rows(text, "endpoints | clients"):
            if row[0] == "leader only" and row[3] == "100":
                etcd[int(row[1])] = {"ops": number(row[4]), "p50": number(row[5]), "p99": number(row[6])}
        peers["etcd"] = etcd
    return peers, sources


def queue_figures(text):
    """The queue tables Redis's and NATS's `queue` phase print (the same columns for both):
    {("queue", pairs): round trips/s and their latency, "queue-latency": (p50, p99),
    "queue-drain": seconds}."""
    figures = {}
    for row in table_rows(text, "queue | pairs"):
        figures[("queue", int(row[1]))] = {"ops": number(row[2]), "p50": number(row[3]), "p99": number(row[4])}
    for row in table_rows(text, "queue latency"):
        figures["queue-latency"] = (number(row[2]), number(row[3]))
    for row in table_rows(text, "queue drain"):
        figures["queue-drain"] = number(row[3])
    return figures


def get(mapping, *keys):
    for key in keys:
        if not isinstance(mapping, dict) or key not in mapping or mapping[key] is None:
            return None
        mapping = mapping[key]
    return mapping


def fmt(value, digits=2):
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:.{digits}f}"


def ratio(tidal, peer, higher_is_better):
    if tidal is None or peer is None or tidal <= 0 or peer <= 0:
        return None
    return tidal / peer if higher_is_better else peer / tidal


def build_rows(figures, gates, peers):
    """(metric, higher_is_better, tidal, {peer: value}, note)."""
    items = lambda c, k: get(tidal_row(figures, "items", c, 1), k)
    redis, pg, nats, etcd = (peers.get(p, {}) for p in ("redis", "postgres", "nats", "etcd"))
    lag = gates.get("replication-lag", {})
    heal = gates.get("heal-100k", {})
    rows = []
    for clients in (1, 16, 50):
        rows.append((f"durable writes/s, {clients} client(s), 1 record each", True, items(clients, "rps"), {
            "redis": get(redis, ("set", 1), "ops") if clients == 50 else None,
            "postgres": get(pg, ("sync", clients), "ops"),
            "nats": get(nats, (clients, 1, 1), "ops"),
            "etcd": get(etcd, clients, "ops"),
        }, "Redis: SET 100 B, 50 clients only; PostgreSQL: sync standby"))
    leader = get(tidal_row(figures, "items" + LEADER, 50, 1), "rps")
    if leader is not None:
        rows.append(("durable writes/s, 50 clients, leader-fsync ack", True, leader, {
            "redis": get(redis, ("set", 1), "ops"),
        }, "Tidal `--durability leader` (acked after the leader's fsync, replicas behind) against Redis "
           "`appendfsync always` with async replicas: the same promise"))
    for q in ("p50", "p99"):
        rows.append((f"ack latency {q} ms, 50 clients", False, items(50, q), {
            "redis": get(redis, ("set", 1), q),
            "postgres": get(pg, ("sync", 50), q),
            "nats": get(nats, (50, 1, 1), q),
            "etcd": get(etcd, 50, q),
        }, ""))
    batched = get(tidal_row(figures, "signals", 16), "eps")
    rows.append(("batched/pipelined records/s", True, batched, {
        "redis": get(redis, ("set", 16), "ops"),
        "nats": get(nats, (1, 256, 1), "ops"),
    }, "Tidal: 16 clients x signal batches; Redis: pipeline 16; NATS: 256 async in flight"))
    for index, q in ((0, "p50"), (1, "p99")):
        tidal = number(lag.get(f"{q}_ms"))
        rows.append((f"replication lag {q} ms (ack -> visible on follower)", False, tidal, {
            "redis": (get(redis, "lag") or (None, None))[index],
            "postgres": (get(pg, ("async", 16), "lag") or (None, None))[index],
        }, "Tidal: on every follower, at half the max rate; Redis: replica 1; PostgreSQL: replay_lag, async, 16 clients"))
    rows.append(("catch-up after 100k missed records, s", False, number(heal.get("catchup_seconds")), {
        "redis": get(redis, "catchup"),
        "postgres": get(pg, "catchup"),
    }, "restart -> caught up; Redis full-resyncs"))
    rows += stream_rows(figures, redis, nats)
    rows += inbox_rows(figures, redis, nats)
    return rows


def stream_rows(figures, redis, nats):
    """The stream rows (issue 39): publish, delivery to a follower's subscriber, reads."""
    publish = lambda c, b, k: get(tidal_row(figures, "publish", c, b), k)
    rows = []
    publish_note = ("Tidal: `publish` (POST /v1/streams/{s}/events, quorum ack); Redis: XADD 100 B to one "
                    "stream; NATS: R3 PubAcks (the durable-writes rows)")
    for clients in (1, 16, 50):
        rows.append((f"stream publish events/s, {clients} client(s), 1 event each", True, publish(clients, 1, "eps"), {
            "redis": get(redis, ("xadd", clients, 1), "ops"),
            "nats": get(nats, (clients, 1, 1), "ops"),
        }, publish_note))
    rows.append(("stream publish in batches of 100, events/s, 16 clients", True, publish(16, 100, "eps"), {
        "redis": get(redis, ("xadd", 16, 100), "ops"),
        "nats": get(nats, (16, 100, 100), "ops"),
    }, "Tidal: 100 events per publish (one batch, all or none); Redis: 100 XADDs pipelined per round trip "
       "(not atomic); NATS: 100 publishes sent at once, the 100 PubAcks awaited before the next batch"))
    for q in ("p50", "p99"):
        rows.append((f"stream publish ack {q} ms, 50 clients", False, publish(50, 1, q), {
            "redis": get(redis, ("xadd", 50, 1), q),
            "nats": get(nats, (50, 1, 1), q),
        }, ""))
    lag = tidal_row(figures, "stream-lag", 4)
    for index, q in ((0, "p50"), (1, "p99")):
        rows.append((f"stream delivery {q} ms (publish ack -> subscriber on every follower)", False, get(lag, q), {
            "redis": (get(redis, "delivery") or (None, None))[index],
        }, "Tidal: `stream-lag`, 4 publishers, SSE subscribers on both followers; Redis: one publisher at a "
           "bounded rate, XREAD BLOCK on both replicas"))
    rows.append(("stream read events/s, one node, pages of 1000", True, get(tidal_row(figures, "stream-read", 2), "eps"), {
        "redis": get(redis, ("xrange", 2), "ops"),
    }, "Tidal: `stream-read`, 2 readers (target >= 1M events/s); Redis: XRANGE COUNT 1000 from a random id, "
       "2 clients, on the primary"))
    return rows


def inbox_rows(figures, redis, nats):
    """The inbox rows: durable work queues (send, receive with a long-poll, ack) against Redis
    Streams consumer groups and a NATS JetStream R3 work-queue stream with a pull consumer."""
    rows = []
    for pairs in (1, 16):
        rows.append((f"queue round trips/s, {pairs} pair(s): send, receive, ack", True,
                     get(tidal_row(figures, "inbox-roundtrip", pairs), "eps"), {
                         "redis": get(redis, ("queue", pairs), "ops"),
                         "nats": get(nats, ("queue", pairs), "ops"),
                     }, "Tidal: `inbox-roundtrip`; Redis: XADD, XREADGROUP COUNT 1 BLOCK, XACK on the primary "
                        "(appendfsync always); NATS: publish (PubAck), fetch(1), ack_sync on an R3 work-queue "
                        "stream; each pair's message may be taken by another pair"))
    latency = tidal_row(figures, "inbox-latency", None)
    for index, q in ((0, "p50"), (1, "p99")):
        rows.append((f"queue delivery {q} ms (send -> a parked receiver has it)", False, get(latency, q), {
            "redis": (get(redis, "queue-latency") or (None, None))[index],
            "nats": (get(nats, "queue-latency") or (None, None))[index],
        }, "Tidal: `inbox-latency`; Redis: XADD sent -> XREADGROUP BLOCK returns; NATS: publish sent -> "
           "fetch(1) returns; one message at a time, the receiver parked again before the next"))
    rows.append(("queue drain s, 10k messages sent first, one consumer", False,
                 get(tidal_row(figures, "inbox-drain", None), "preloaded_s"), {
                     "redis": get(redis, "queue-drain"),
                     "nats": get(nats, "queue-drain"),
                 }, "Tidal: `inbox-drain` (its preloaded drain); Redis: XREADGROUP COUNT 1000 + one XACK per batch "
                    "(entries stay in the stream, out of the group's pending list); NATS: fetch(1000), ack each, "
                    "the batch's last with ack_sync"))
    return rows


PEERS = ("redis", "postgres", "nats", "etcd")


def markdown(rows, sources, figures, gates):
    out = ["# Tidal vs peers (same sitting)", "",
           "Ratio columns: > 1 means Tidal is ahead (throughput: Tidal / peer; latency, lag, catch-up time: peer / Tidal).",
           "The machine is shared and noisy; these are one run's figures.", "",
           "| metric | Tidal | " + " | ".join(f"{p} | ratio" for p in PEERS) + " |",
           "|---|---:|" + "---:|---:|" * len(PEERS)]
    for metric, higher, tidal, peer_values, _ in rows:
        cells = [metric, fmt(tidal)]
        for peer in PEERS:
            value = peer_values.get(peer)
            r = ratio(tidal, value, higher)
            cells += [fmt(value), "-" if r is None else f"{r:.2f}x"]
        out.append("| " + " | ".join(cells) + " |")
    out += ["", "Notes:", ""]
    noted = set()
    for metric, _, _, _, note in rows:
        if note and note not in noted:
            noted.add(note)
            out.append(f"- {metric.split(',')[0]}: {note}.")
    out += ["- Tidal acks a write once a majority (2 of 3) fsynced it and the leader applied it (quorum durability),",
            "  except in the leader-fsync row.",
            "- NATS 2.9 acks after a quorum stored the message WITHOUT fsync (see bench/peers/README.md).", "",
            "Sources:", ""]
    for peer, path in sources.items():
        out.append(f"- {peer}: {path or 'not run / no result table'}")
    out += ["", "Tidal rows from `tidal bench`:", ""]
    for (_, clients, _), entry in sorted(figures.items()):
        out.append(f"- {entry['workload']} c={clients} batch={entry['batch']}: {entry['rps']:.0f} requests/s, "
                   f"{entry['eps']:.0f} records/s, p50 {entry['p50']} ms, p99 {entry['p99']} ms, errors {entry['errors']}")
    out += ["", "Tidal gate figures (`tidal gates --results`):", ""]
    for name, values in gates.items():
        out.append(f"- {name}: " + " ".join(f"{k}={v}" for k, v in values.items()))
    return "\n".join(out) + "\n"


def svg(rows):
    """Horizontal bars of log2(ratio) per metric and peer; the axis is centred on 1x."""
    colors = {"redis": "#d62728", "postgres": "#1f77b4", "nats": "#2ca02c", "etcd": "#9467bd"}
    bars = [(metric, peer, ratio(tidal, values.get(peer), higher))
            for metric, higher, tidal, values, _ in rows for peer in PEERS]
    bars = [b for b in bars if b[2] is not None]
    label_w, plot_w, bar_h, top = 380, 420, 14, 50
    height = top + len(bars) * (bar_h + 4) + 60
    centre = label_w + plot_w / 2
    scale = plot_w / 2 / 4.0  # +-4 in log2 = 1/16x .. 16x
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{label_w + plot_w + 40}" height="{height}" '
           'font-family="sans-serif" font-size="11">',
           f'<text x="10" y="20" font-size="14">Tidal vs peers: ratio, log scale (right of 1x = Tidal ahead)</text>']
    for tick in (-4, -2, -1, 0, 1, 2, 4):
        x = centre + tick * scale
        out.append(f'<line x1="{x:.1f}" y1="{top - 10}" x2="{x:.1f}" y2="{height - 50}" stroke="#ccc"/>')
        label = f"{2 ** tick:g}x" if tick >= 0 else f"1/{2 ** -tick:g}x"
        out.append(f'<text x="{x:.1f}" y="{height - 36}" text-anchor="middle">{label}</text>')
    y = top
    for metric, peer, r in bars:
        v = max(-4.0, min(4.0, math.log2(r)))
        x0, x1 = sorted((centre, centre + v * scale))
        out.append(f'<text x="{label_w - 6}" y="{y + bar_h - 3}" text-anchor="end">{metric} vs {peer}</text>')
        out.append(f'<rect x="{x0:.1f}" y="{y}" width="{max(x1 - x0, 1):.1f}" height="{bar_h}" fill="{colors[peer]}"/>')
        out.append(f'<text x="{x1 + 4 if v >= 0 else x0 - 4:.1f}" y="{y + bar_h - 3}" '
                   f'text-anchor="{"start" if v >= 0 else "end"}">{r:.2f}x</text>')
        y += bar_h + 4
    out.append(f'<line x1="{centre}" y1="{top - 10}" x2="{centre}" y2="{height - 50}" stroke="#000"/>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tidal-bench", required=True)
    parser.add_argument("--tidal-gates", required=True)
    parser.add_argument("--tidal-leader-bench")
    parser.add_argument("--anchors", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    figures, gates = tidal_figures(args.tidal_bench, args.tidal_gates, args.tidal_leader_bench)
    peers, sources = peer_figures(args.anchors)
    rows = build_rows(figures, gates, peers)
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "REPORT.md").write_text(markdown(rows, sources, figures, gates))
    (out / "ratios.svg").write_text(svg(rows))
    sys.stdout.write((out / "REPORT.md").read_text())


if __name__ == "__main__":
    main()
