#!/usr/bin/env python3
"""The vector-store peer of `tidal bench --workload feed|similar` (decisions/067): HNSW (hnswlib,
the index Qdrant and pgvector implement, with their default M = 16) over the SAME clustered
embeddings the bench loads (bench_feed.rs: item i is centre (i % 1000) plus 0.5 of noise, from
SplitMix64), in process: no server, no network, no durability. Measures the build rate, top-20
query latency by cosine at one client, recall@20 against the exact scan (numpy), and the same
with a filter that excludes the 1,000 nearest items (a user who has seen them).

  hnsw_peer.py ITEMS DIM [QUERIES]

Prints key=value lines; the last one is `hnsw: items <N>, dims <D>, recall@20 <R>, p50 <X> ms,
p99 <Y> ms, build <S> s`.
"""
import sys
import time

import numpy as np

CLUSTERS = 1000
SPREAD = 0.5
MASK = (1 << 64) - 1


def splitmix(seeds):
    """SplitMix64's finalizer of `seed + golden` as values in [-1, 1), as bench_feed.rs."""
    z = (seeds + np.uint64(0x9E3779B97F4A7C15)) & np.uint64(MASK)
    z = ((z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)) & np.uint64(MASK)
    z = ((z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)) & np.uint64(MASK)
    z = z ^ (z >> np.uint64(31))
    return (z >> np.uint64(11)).astype(np.float64) / float(1 << 53) * 2.0 - 1.0


def embeddings(first, count, dim):
    ids = np.arange(first, first + count, dtype=np.uint64)[:, None]
    dims = np.arange(dim, dtype=np.uint64)[None, :]
    with np.errstate(over="ignore"):
        centre = splitmix((ids % np.uint64(CLUSTERS)) * np.uint64(4099) + dims)
        noise = splitmix((ids << np.uint64(16)) ^ dims ^ np.uint64(0x5EED))
    return (centre + SPREAD * noise).astype(np.float32)


def main():
    # Here, not at the top: pgvector_peer.py imports embeddings() from this file without hnswlib.
    import hnswlib

    items, dim = int(sys.argv[1]), int(sys.argv[2])
    queries = int(sys.argv[3]) if len(sys.argv) > 3 else 200
    data = np.concatenate([embeddings(first, min(100_000, items - first), dim) for first in range(0, items, 100_000)])
    unit = data / np.linalg.norm(data, axis=1, keepdims=True)
    index = hnswlib.Index(space="cosine", dim=dim)
    index.init_index(max_elements=items, M=16, ef_construction=100, random_seed=1)
    began = time.perf_counter()
    index.add_items(data, np.arange(items), num_threads=2)
    build_s = time.perf_counter() - began
    print(f"build_s={build_s:.1f} build_per_s={items / build_s:.0f} threads=2 M=16 ef_construction=100")
    # Queries: the items the bench's similar workload asks for (id n * 7919), as vectors.
    picks = (np.arange(queries, dtype=np.uint64) * np.uint64(7919)) % np.uint64(items)
    # The 1,020 nearest of each: the first 20 are the answer, the next 20 the answer once the
    # first 1,000 are excluded.
    exact = [np.argsort(-(unit @ unit[p]), kind="stable")[:1020] for p in picks]
    for ef in (64, 128, 256):
        index.set_ef(ef)
        latencies, found = [], 0
        for p, truth in zip(picks, exact):
            began = time.perf_counter()
            labels, _ = index.knn_query(data[p], k=20, num_threads=1)
            latencies.append((time.perf_counter() - began) * 1e3)
            found += len(set(labels[0].tolist()) & set(truth[:20].tolist()))
        latencies.sort()
        p50, p99 = latencies[len(latencies) // 2], latencies[int((len(latencies) - 1) * 0.99)]
        recall = found / (20 * queries)
        print(f"ef={ef} recall@20={recall:.3f} p50_ms={p50:.3f} p99_ms={p99:.3f}")
        # The same queries with the 1,000 nearest items excluded by a filter, as seen items are.
        filtered_found, filtered_lat = 0, []
        for p, truth in zip(picks, exact):
            seen = set(truth[:1000].tolist())
            began = time.perf_counter()
            labels, _ = index.knn_query(data[p], k=20, num_threads=1, filter=lambda label: label not in seen)
            filtered_lat.append((time.perf_counter() - began) * 1e3)
            filtered_found += len(set(labels[0].tolist()) & set(truth[1000:1020].tolist()))
        filtered_lat.sort()
        print(
            f"ef={ef} filtered recall@20={filtered_found / (20 * queries):.3f} "
            f"p50_ms={filtered_lat[len(filtered_lat) // 2]:.3f} p99_ms={filtered_lat[int((len(filtered_lat) - 1) * 0.99)]:.3f}"
        )
    print(f"hnsw: items {items}, dims {dim}, recall@20 {recall:.3f}, p50 {p50:.2f} ms, p99 {p99:.2f} ms, build {build_s:.0f} s")


if __name__ == "__main__":
    main()
