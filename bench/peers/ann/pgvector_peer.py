#!/usr/bin/env python3
"""The pgvector peer of `tidal bench --workload similar` (decisions/067), run by pgvector.sh
against one PostgreSQL server on 127.0.0.1: the SAME clustered embeddings as hnsw_peer.py (its
`embeddings`), loaded into `items(id bigint primary key, embedding vector(DIM))` by a binary COPY,
then pgvector's HNSW index (cosine; by default m = 16, ef_construction = 64, pgvector's), then the
similar-items query over TCP with prepared statements, one connection per client:

  SELECT id FROM items WHERE id <> $pick ORDER BY embedding <=> $vector LIMIT 20

with the items the bench asks for (id n * 7919 % ITEMS). As Tidal's similar items, the answer
leaves the item itself out, so the truth (numpy's exact scan, as in hnsw_peer.py) is the 20
nearest OTHER items. Measured: the load and build rates; recall@20, p50 and p99 for each
hnsw.ef_search at 1 client; throughput, p50 and p99 at CLIENTS clients; the same query with the
1,000 nearest items excluded (`id <> ALL($seen)`, a user who has seen them; the truth is then the
next 20) without iterative scans, with `hnsw.iterative_scan = relaxed_order` (re-ordered by
distance in an outer query, as pgvector's README shows) and with `strict_order`; and a few exact
scans (`enable_indexscan = off`). Every loop is bounded by a count and by --seconds.

  pgvector_peer.py --port PORT --items N --dim D [--queries Q] [--clients C] [--seconds S] ...

Prints key=value lines; the last one is `pgvector: items <N>, dims <D>, recall@20 <R>, p50 <X> ms,
p99 <Y> ms, build <S> s` (the default hnsw.ef_search, 40, at 1 client). Progress goes to stderr.
"""
import argparse
import os
import re
import sys
import threading
import time

import numpy as np
import psycopg
from psycopg.types.numeric import Int8

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hnsw_peer import embeddings  # noqa: E402  (the generator, shared with the hnswlib peer)

K = 20
SEEN = 1000
CHUNK = 100_000
DEFAULT_EF = 40
SIMILAR = "SELECT id FROM items WHERE id <> %(pick)s ORDER BY embedding <=> %(vec)s::vector LIMIT 20"
FILTERED = (
    "SELECT id FROM items WHERE id <> %(pick)s AND id <> ALL(%(seen)s::bigint[])"
    " ORDER BY embedding <=> %(vec)s::vector LIMIT 20"
)
# relaxed_order may return rows slightly out of order: a materialized CTE and an outer ORDER BY
# put them back in order (pgvector's README; `+ 0` keeps PostgreSQL 17+ from skipping the sort).
FILTERED_RELAXED = (
    "WITH relaxed AS MATERIALIZED (SELECT id, embedding <=> %(vec)s::vector AS distance FROM items"
    " WHERE id <> %(pick)s AND id <> ALL(%(seen)s::bigint[]) ORDER BY distance LIMIT 20)"
    " SELECT id FROM relaxed ORDER BY distance + 0"
)


def log(message):
    print(f"{time.strftime('%H:%M:%S', time.gmtime())} {message}", file=sys.stderr, flush=True)


def figure(line):
    print(line, flush=True)


def p50_p99(latencies):
    """As hnsw_peer.py: the middle and the 99th of the sorted latencies (ms)."""
    if not latencies:  # the time bound struck first
        return float("nan"), float("nan")
    ordered = sorted(latencies)
    return ordered[len(ordered) // 2], ordered[int((len(ordered) - 1) * 0.99)]


class Budget:
    def __init__(self, seconds):
        self.until = time.monotonic() + seconds

    def left(self):
        return self.until - time.monotonic()

    def out(self):
        return self.left() <= 0


def connect(port):
    return psycopg.connect(host="127.0.0.1", port=port, user="postgres", dbname="postgres", autocommit=True)


def copy_block(first, vectors):
    """Rows first.. of `vectors` in COPY's binary row format: 2 fields, the bigint id, the vector
    as pgvector's binary form (int16 dim, int16 0, float4 x dim), all big-endian."""
    count, dim = vectors.shape
    row = np.dtype(
        [("fields", ">i2"), ("id_len", ">i4"), ("id", ">i8"), ("vec_len", ">i4"), ("dim", ">i2"),
         ("unused", ">i2"), ("values", ">f4", (dim,))]
    )
    rows = np.empty(count, dtype=row)
    rows["fields"], rows["id_len"], rows["vec_len"], rows["dim"], rows["unused"] = 2, 8, 4 + 4 * dim, dim, 0
    rows["id"] = np.arange(first, first + count, dtype=np.int64)
    rows["values"] = vectors
    return rows.tobytes()


def load(conn, data):
    items = len(data)
    began = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy("COPY items (id, embedding) FROM STDIN WITH (FORMAT binary)") as copy:
            copy.write(b"PGCOPY\n\xff\r\n\x00" + (0).to_bytes(4, "big") + (0).to_bytes(4, "big"))
            for first in range(0, items, CHUNK):
                copy.write(copy_block(first, data[first : first + CHUNK]))
                if (first // CHUNK) % 2 == 1:
                    log(f"load: {first + CHUNK} rows")
            copy.write((-1).to_bytes(2, "big", signed=True))
    return time.perf_counter() - began


def build_index(port, budget, with_clause):
    """CREATE INDEX (timed), with its progress on stderr every 15 s from a second connection."""
    notices, stop, seen_workers = [], threading.Event(), [0]

    def watch():
        with connect(port) as conn:
            wait = 5  # the first look early (the parallel worker), then every 15 s
            while not stop.wait(wait):
                wait = 15
                row = conn.execute(
                    "SELECT phase, tuples_done, tuples_total FROM pg_stat_progress_create_index"
                ).fetchone()
                workers = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'parallel worker'"
                ).fetchone()[0]
                seen_workers[0] = max(seen_workers[0], workers)
                if row:
                    log(f"build: {row[0]}, tuples {row[1]} of {row[2]}, parallel workers {workers}")

    watcher = threading.Thread(target=watch, daemon=True)
    with connect(port) as conn:
        conn.add_notice_handler(lambda diag: notices.append(diag.message_primary or ""))
        conn.execute(f"SET statement_timeout = {max(1, int(budget.left() * 1000))}")
        watcher.start()
        began = time.perf_counter()
        try:
            conn.execute(f"CREATE INDEX items_embedding_idx ON items USING hnsw (embedding vector_cosine_ops) {with_clause}")
        finally:
            stop.set()
        build_s = time.perf_counter() - began
    watcher.join(timeout=30)
    for notice in notices:
        log(f"build notice: {notice}")
    in_memory = "no" if any("no longer fits" in n for n in notices) else "yes"
    return build_s, in_memory, seen_workers[0]


def prepared(conn, ef, iterative="off"):
    conn.execute(f"SET hnsw.ef_search = {int(ef)}")
    conn.execute(f"SET hnsw.iterative_scan = {iterative}")
    return conn.cursor()


def run_one(cur, query, params):
    began = time.perf_counter()
    cur.execute(query, params, prepare=True)
    rows = cur.fetchall()
    return (time.perf_counter() - began) * 1e3, [r[0] for r in rows]


def sweep(cur, query, cases, budget):
    """One client: each case (params, truth) once, in order; latencies (ms), found (per query),
    rows."""
    cur.execute(query, cases[0][0], prepare=True)  # parse and plan once, untimed
    cur.fetchall()
    latencies, found, rows = [], [], 0
    for params, truth in cases:
        if budget.out():
            break
        ms, ids = run_one(cur, query, params)
        latencies.append(ms)
        found.append(len(set(ids) & truth))
        rows += len(ids)
    return latencies, found, rows


def clients_run(port, ef, cases, clients, seconds, budget):
    """`clients` threads, each with its own connection, looping the similar query over the picks
    (each starting at its own offset) until `seconds` pass or each made 100,000 queries."""
    latencies = [[] for _ in range(clients)]
    errors = []
    bounds = {}

    def start():
        bounds["until"] = time.perf_counter() + min(seconds, max(1.0, budget.left()))
        bounds["began"] = time.perf_counter()

    barrier = threading.Barrier(clients, action=start)

    def client(index):
        try:
            with connect(port) as conn:
                cur = prepared(conn, ef)
                cur.execute(SIMILAR, cases[index % len(cases)][0], prepare=True)
                cur.fetchall()
                barrier.wait(timeout=120)
                n, mine = index, latencies[index]
                while len(mine) < 100_000 and time.perf_counter() < bounds["until"]:
                    ms, _ = run_one(cur, SIMILAR, cases[n % len(cases)][0])
                    mine.append(ms)
                    n += clients
        except Exception as error:  # reported after the join
            errors.append(error)
            barrier.abort()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=seconds + 300)
    if errors or any(thread.is_alive() for thread in threads):
        raise RuntimeError(f"{clients}-client run failed: {errors[:1] or 'a client did not finish'}")
    elapsed = time.perf_counter() - bounds["began"]
    every = [ms for mine in latencies for ms in mine]
    return len(every), elapsed, every


def size_mb(conn, relation):
    return conn.execute("SELECT pg_relation_size(%s::regclass)", (relation,)).fetchone()[0] / 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--items", type=int, default=1_000_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--m", type=int, default=16, help="HNSW m (pgvector's default)")
    parser.add_argument("--ef-construction", type=int, default=64, help="pgvector's default")
    parser.add_argument("--ef-search", default="40 64 128 256", help="1-client sweep")
    parser.add_argument("--conc-ef", default="40 128", help="ef_search of the --clients runs")
    parser.add_argument("--conc-seconds", type=float, default=15)
    parser.add_argument("--exact-queries", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=3300, help="bound on everything")
    args = parser.parse_args()
    budget = Budget(args.seconds)
    items, dim, queries = args.items, args.dim, min(args.queries, args.items)
    efs = [int(e) for e in args.ef_search.split()]
    conc_efs = [int(e) for e in args.conc_ef.split()]
    if items < SEEN + K + 1:
        sys.exit(f"--items must be at least {SEEN + K + 1}")

    log(f"generating {items} x {dim} embeddings (hnsw_peer.embeddings)")
    data = np.concatenate([embeddings(first, min(CHUNK, items - first), dim) for first in range(0, items, CHUNK)])
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    picks = (np.arange(queries, dtype=np.uint64) * np.uint64(7919)) % np.uint64(items)
    # As hnsw_peer.py, the exact scan by numpy, but without the item itself (Tidal's similar
    # items leave it out): the first 20 are the answer, the next 20 the answer once the first
    # 1,000 are excluded.
    log(f"exact top {SEEN + K} of {queries} picks (numpy)")
    exact = []
    for p in picks:
        sims = unit @ unit[p]
        sims[p] = -np.inf
        exact.append(np.argsort(-sims, kind="stable")[: SEEN + K])
    del unit
    vec_text = {int(p): "[" + ",".join(repr(x) for x in data[p].tolist()) + "]" for p in picks}
    similar_cases = [
        ({"pick": Int8(int(p)), "vec": vec_text[int(p)]}, set(t[:K].tolist())) for p, t in zip(picks, exact)
    ]
    filtered_cases = [
        ({"pick": Int8(int(p)), "vec": vec_text[int(p)], "seen": [int(i) for i in t[:SEEN]]}, set(t[SEEN:].tolist()))
        for p, t in zip(picks, exact)
    ]

    with connect(args.port) as conn:
        server = conn.execute("SHOW server_version").fetchone()[0]
        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
        conn.execute("CREATE EXTENSION IF NOT EXISTS pg_prewarm")
        version = conn.execute("SELECT extversion FROM pg_extension WHERE extname = 'vector'").fetchone()[0]
        settings = dict(
            conn.execute(
                "SELECT name, setting || coalesce(unit, '') FROM pg_settings WHERE name IN ('shared_buffers',"
                " 'maintenance_work_mem', 'max_parallel_maintenance_workers', 'fsync', 'synchronous_commit')"
            ).fetchall()
        )
        figure(
            f"server=postgresql-{server} pgvector={version} shared_buffers={settings['shared_buffers']}"
            f" maintenance_work_mem={settings['maintenance_work_mem']}"
            f" max_parallel_maintenance_workers={settings['max_parallel_maintenance_workers']}"
            f" fsync={settings['fsync']} synchronous_commit={settings['synchronous_commit']} connection=tcp-127.0.0.1"
        )
        conn.execute(f"CREATE TABLE items (id bigint PRIMARY KEY, embedding vector({dim}))")

        log(f"load: COPY (binary) of {items} rows")
        load_s = load(conn, data)
        figure(f"items={items} dims={dim} load_s={load_s:.1f} load_per_s={items / load_s:.0f} how=copy-binary-one-transaction")
        began = time.perf_counter()
        conn.execute("VACUUM (ANALYZE) items")
        figure(f"vacuum_analyze_s={time.perf_counter() - began:.1f} table_mb={size_mb(conn, 'items'):.0f}")

        with_clause = f"WITH (m = {args.m}, ef_construction = {args.ef_construction})"
        log(f"build: CREATE INDEX ... USING hnsw (embedding vector_cosine_ops) {with_clause}")
        build_s, in_memory, workers = build_index(args.port, budget, with_clause)
        figure(
            f"build_s={build_s:.1f} build_per_s={items / build_s:.0f} m={args.m} ef_construction={args.ef_construction}"
            f" parallel_workers_seen={workers} graph_in_memory={in_memory} index_mb={size_mb(conn, 'items_embedding_idx'):.0f}"
        )
        began = time.perf_counter()
        conn.execute("CHECKPOINT")
        checkpoint_s = time.perf_counter() - began
        began = time.perf_counter()
        pages = conn.execute("SELECT pg_prewarm('items') + pg_prewarm('items_embedding_idx')").fetchone()[0]
        figure(f"checkpoint_s={checkpoint_s:.1f} prewarm_s={time.perf_counter() - began:.1f} prewarm_pages={pages}")
        conn.execute("SET hnsw.ef_search = 40")
        plan = [r[0] for r in conn.execute("EXPLAIN " + SIMILAR, similar_cases[0][0])]
        log("plan: " + re.sub(r"'\[[^]]*\]'", "'[...]'", " | ".join(line.strip() for line in plan)))
        if not any("items_embedding_idx" in line for line in plan):
            sys.exit("the similar query does not use the HNSW index")

    # 1 client: recall@20 and latency for each ef_search; then the filtered query.
    default = None
    with connect(args.port) as conn:
        for ef in efs:
            if budget.out():
                log(f"time bound reached: ef_search={ef} and later skipped")
                break
            log(f"1 client, ef_search={ef}")
            latencies, found, _ = sweep(prepared(conn, ef), SIMILAR, similar_cases, budget)
            p50, p99 = p50_p99(latencies)
            recall = sum(found) / (K * max(1, len(latencies)))
            # How the misses spread: a few queries that found almost nothing, or all a little.
            figure(
                f"ef_search={ef} clients=1 queries={len(latencies)} recall@20={recall:.3f} p50_ms={p50:.3f} p99_ms={p99:.3f}"
                f" queries_all_20={sum(f == K for f in found)} queries_under_10={sum(f < K // 2 for f in found)}"
            )
            if ef == DEFAULT_EF:
                default = (recall, p50, p99)
            for mode in ("off", "relaxed_order", "strict_order"):
                if budget.out():
                    break
                query = FILTERED_RELAXED if mode == "relaxed_order" else FILTERED
                latencies, found, rows = sweep(prepared(conn, ef, mode), query, filtered_cases, budget)
                p50, p99 = p50_p99(latencies)
                figure(
                    f"ef_search={ef} filtered seen={SEEN} iterative_scan={mode} queries={len(latencies)}"
                    f" recall@20={sum(found) / (K * max(1, len(latencies))):.3f} rows_mean={rows / max(1, len(latencies)):.1f}"
                    f" p50_ms={p50:.3f} p99_ms={p99:.3f}"
                )

    # CLIENTS clients, each on its own connection.
    for ef in conc_efs:
        if budget.left() < 10:
            log(f"time bound reached: {args.clients}-client runs skipped")
            break
        log(f"{args.clients} clients, ef_search={ef}, {args.conc_seconds:.0f} s")
        count, elapsed, latencies = clients_run(args.port, ef, similar_cases, args.clients, args.conc_seconds, budget)
        p50, p99 = p50_p99(latencies)
        figure(
            f"ef_search={ef} clients={args.clients} queries={count} seconds={elapsed:.1f}"
            f" queries_per_s={count / elapsed:.0f} p50_ms={p50:.3f} p99_ms={p99:.3f}"
        )

    # The exact scan, for reference (a sequential scan and a top-20 sort; parallel as planned).
    if budget.left() > 30 and args.exact_queries > 0:
        with connect(args.port) as conn:
            conn.execute("SET enable_indexscan = off")
            conn.execute("SET statement_timeout = 60000")
            cur = conn.cursor()
            # recall@20 here checks the truth itself (it must be 1.000, ties aside).
            for name, query, cases in (("similar", SIMILAR, similar_cases), ("filtered", FILTERED, filtered_cases)):
                latencies, found = [], 0
                for params, truth in cases[: args.exact_queries]:
                    if budget.left() < 30:
                        break
                    ms, ids = run_one(cur, query, params)
                    latencies.append(ms)
                    found += len(set(ids) & truth)
                if latencies:
                    figure(
                        f"exact {name} enable_indexscan=off queries={len(latencies)}"
                        f" recall@20={found / (K * len(latencies)):.3f} min_ms={min(latencies):.1f} max_ms={max(latencies):.1f}"
                    )

    if default is None:
        sys.exit(f"ef_search={DEFAULT_EF} was not measured (--ef-search or the time bound)")
    recall, p50, p99 = default
    figure(f"pgvector: items {items}, dims {dim}, recall@20 {recall:.3f}, p50 {p50:.2f} ms, p99 {p99:.2f} ms, build {build_s:.0f} s")


if __name__ == "__main__":
    main()
