# Tidal: build, test, bench. `make verify` is the read-only gate CI runs; `make fix` mutates.
CARGO ?= cargo
BENCH_SECONDS ?= 10

.PHONY: build run down single test model-check sim sim-determinism verify fix lint bench bench-wal bench-feed bench-cluster clean

build:
	$(CARGO) build --release --bin tidal

# The quick start: a local 3-node cluster on loopback (data, logs and the cluster file in
# ./tidal-cluster; HTTP on 127.0.0.1:7070-7072). Stop it with `make down`.
run: build
	./target/release/tidal cluster up --nodes 3 --dir ./tidal-cluster

down:
	./target/release/tidal cluster down --dir ./tidal-cluster

# One node on its defaults (data in ./tidal-data, HTTP on 127.0.0.1:7070).
single: build
	./target/release/tidal serve

# Every test in the workspace (unit, crate integration, recovery, golden fixture, HTTP end to end).
test:
	$(CARGO) nextest run --workspace --no-fail-fast

# The replication protocol model-checked with deeper bounds, plus every planted bug (release build;
# minutes). The last line: `model-check: <states> states, <violations> violations, <found>/<planted> ...`.
model-check:
	$(CARGO) run --release -p tidal-model -- --deep

# The turmoil simulation (harness/sim): SEEDS seeds from FIRST over every scenario (or SCENARIO=name:
# steady, network, crash, chaos); one summary line per run, then fault totals and the last line
# `sim: <runs> runs, <failed> failed, <violations> violations`. A failing run prints its replay command.
SEEDS ?= 8
FIRST ?= 1
SCENARIO ?=
sim:
	$(CARGO) run --profile test -p tidal-sim -- --seeds $(SEEDS) --first $(FIRST) $(if $(SCENARIO),--scenario $(SCENARIO))

# 32 seeds twice each (SCENARIO=chaos by default); prints how many replay to the same trace hash
# (decisions/008). Not under nextest: it runs for minutes.
sim-determinism:
	TIDAL_SIM_SCENARIO=$(or $(SCENARIO),chaos) $(CARGO) test --profile test -p tidal-sim --test sim -- --ignored --nocapture determinism

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

verify: lint test

fix:
	$(CARGO) fmt --all
	$(CARGO) clippy --workspace --all-targets --fix --allow-dirty -- -D warnings

# Benchmarks print numbers; tests never time anything.
bench: build bench-wal bench-feed bench-cluster
	./target/release/tidal bench --spawn --workload signals --batch 1000 --concurrency 16 --seconds $(BENCH_SECONDS)
	./target/release/tidal bench --spawn --workload items --concurrency 64 --seconds $(BENCH_SECONDS)
	./target/release/tidal bench --spawn --workload embeddings --concurrency 64 --seconds $(BENCH_SECONDS)

# A 3-node local cluster (quorum): replication lag (ack -> visible on every follower) and ingest.
bench-cluster: build
	./target/release/tidal cluster up --dir ./target/bench-cluster --port-base 24070
	./target/release/tidal bench --url http://127.0.0.1:24070 --followers http://127.0.0.1:24071,http://127.0.0.1:24072 --workload lag --concurrency 4 --seconds $(BENCH_SECONDS)
	./target/release/tidal bench --url http://127.0.0.1:24070 --workload signals --batch 1000 --concurrency 16 --seconds $(BENCH_SECONDS)
	./target/release/tidal cluster down --dir ./target/bench-cluster

bench-wal:
	$(CARGO) run --release -p tidal-wal --example wal_bench -- --seconds 3

bench-feed:
	$(CARGO) run --release -p tidal-core --example feed_bench

clean:
	$(CARGO) clean
