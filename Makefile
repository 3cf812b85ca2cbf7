# Tidal: build, test, bench. `make verify` is the read-only gate CI runs; `make fix` mutates.
CARGO ?= cargo
BENCH_SECONDS ?= 10
# The binary cargo builds (CARGO_TARGET_DIR moves it).
TIDAL ?= $(or $(CARGO_TARGET_DIR),target)/release/tidal
# The peer scripts (bench/peers: Redis, PostgreSQL, NATS, etcd, the machine's limits). gates and
# bench-peers run a writable copy, $(ANCHORS_WORK)/anchors, where their venv and results stay.
ANCHORS ?= bench/peers
ANCHORS_WORK ?= target/anchors-work
REPORT_DIR ?= target/bench-report

.PHONY: build run down single test fuzz model-check sim chaos crash-sweep sim-determinism verify fix lint bench bench-wal bench-feed bench-replay bench-cluster bench-quorum bench-peers bench-crash peers-work gates demo clean

build:
	$(CARGO) build --release --bin tidal

# The quick start: a local 3-node cluster on loopback (data, logs and the cluster file in
# ./tidal-cluster; HTTP on 127.0.0.1:7070-7072). Stop it with `make down`.
run: build
	$(TIDAL) cluster up --nodes 3 --dir ./tidal-cluster

down:
	$(TIDAL) cluster down --dir ./tidal-cluster

# One node on its defaults (data in ./tidal-data, HTTP on 127.0.0.1:7070).
single: build
	$(TIDAL) serve

# Every test in the workspace (unit, crate integration, recovery, golden fixture, HTTP end to end).
# Installs cargo-nextest first when this machine lacks it (a fresh machine with only Rust).
test:
	@$(CARGO) nextest --version >/dev/null 2>&1 || { \
	  echo "make test: cargo-nextest is not installed; installing it: $(CARGO) install cargo-nextest --locked (a few minutes, once)"; \
	  $(CARGO) install cargo-nextest --locked || { echo "make test: installing cargo-nextest failed; install it by hand (https://nexte.st)"; exit 1; }; \
	}
	$(CARGO) nextest run --workspace --no-fail-fast

# The decoders under libFuzzer (fuzz/): WAL segments as recovery scans them (encoded, then damaged),
# record payloads, replication RPC messages, the write routes' request bodies (http_request);
# FUZZ_SECONDS each. Needs a nightly toolchain and
# `cargo install cargo-fuzz`; not part of `make test`. A crash leaves its input in fuzz/artifacts/.
FUZZ_SECONDS ?= 60
fuzz:
	cd fuzz && for target in wal_segment payload rpc http_request; do \
	  cargo +nightly fuzz run $$target -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# The replication protocol model-checked with deeper bounds, plus every planted bug (release build;
# minutes). The last line: `model-check: <states> states, <violations> violations, <found>/<planted> ...`.
model-check:
	$(CARGO) run --release -p tidal-model -- --deep

# The turmoil simulation (chaos/sim; chaos/README.md says what it checks and how to replay a seed):
# SEEDS seeds from FIRST over every scenario (or SCENARIO=name or a comma list: steady, network,
# crash, chaos, leader-crash, partition-heal, follower-outage, rotation, disk, register,
# fatal-handover); one summary line per run, then fault totals and the last line
# `sim: <runs> runs, <failed> failed, <violations> violations`. A failing run prints its replay command.
SEEDS ?= 8
FIRST ?= 1
SCENARIO ?=
JOBS ?= 2
sim:
	$(CARGO) run --profile test -p tidal-sim -- --seeds $(SEEDS) --first $(FIRST) --jobs $(JOBS) $(if $(SCENARIO),--scenario $(SCENARIO))

# The chaos sweep: the closed entries of chaos/regressions.txt (how to add one: chaos/README.md),
# then SEEDS seeds from FIRST over every scenario (or SCENARIO=...), JOBS at a time; a progress line
# per run, a summary table (runs, failures, violations, faults injected by class, per scenario) and
# the last line exactly
# `chaos: <runs> runs, <violations> violations`. Non-zero exit on any violation.
chaos:
	$(CARGO) run --profile test -p tidal-sim -- --chaos --seeds $(SEEDS) --first $(FIRST) --jobs $(JOBS) $(if $(SCENARIO),--scenario $(SCENARIO))

# The crash-point sweep (chaos/sim/src/crashpoint.rs, chaos/README.md): a fixed scenario, the node
# killed at every durability boundary (leader: write, fsync, ship, rotate, apply, applied; follower:
# receive, append, fsync, ack, apply, applied) at its k-th occurrence for every k in KS, with lost and with torn unsynced bytes; one run each, every
# invariant checked. Last line `crash-points: <covered>/<total> points, <runs> runs, <lost>
# acknowledged writes lost, <violations> violations`. Non-zero exit on any violation and on any
# point not reached. CI runs it (.ci/run).
KS ?= 1,2,3,5,8
crash-sweep:
	$(CARGO) run --profile test -p tidal-sim -- --crash-sweep --ks $(KS) --jobs $(JOBS)

# The simulation's replays (chaos/README.md, "Determinism"): 32 seeds twice each (SCENARIO=chaos by
# default; TIDAL_SIM_SEED=S for one seed); prints how many replay to the same trace hash and fails
# unless all do (decisions/051, 052). Not under nextest: it runs for a minute or so.
sim-determinism:
	TIDAL_SIM_SCENARIO=$(or $(SCENARIO),chaos) $(CARGO) test --profile test -p tidal-sim --test sim -- --ignored --nocapture determinism

# Network chaos (chaos/net; chaos/README.md, "Network chaos"): the real tidal binary, three nodes,
# each in its own network namespace; partitions (full and partial), one-way cuts, asymmetric loss,
# latency, a flapping link, SIGKILL and SIGSTOP, made with ip and tc while writers run; after each
# fault: heal, equal digests, every acknowledged write on every node. Needs root and iproute2
# (prints `skipped: <why>` and passes otherwise). chaos-net: one pass over every fault class (about
# two minutes); chaos-net-soak: random faults from SEED (the clock if unset; printed) for MINUTES.
# Last line `netchaos: <runs> runs, <faults> faults, <lost> acknowledged writes lost, <violations> violations`.
# The debug (test-profile) binaries: `make test` has already built them.
.PHONY: chaos-net chaos-net-soak
MINUTES ?= 30
SEED ?=
CHAOS_NET_BUILD = $(CARGO) build --profile test -p tidal-cli -p tidal-netchaos --bin tidal --bin tidal-netchaos
chaos-net:
	$(CHAOS_NET_BUILD)
	$(CARGO) run --profile test -p tidal-netchaos --
chaos-net-soak:
	$(CHAOS_NET_BUILD)
	$(CARGO) run --profile test -p tidal-netchaos -- --soak-minutes $(MINUTES) $(if $(SEED),--seed $(SEED))

lint:
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings

verify: lint test

fix:
	$(CARGO) fmt --all
	$(CARGO) clippy --workspace --all-targets --fix --allow-dirty -- -D warnings

# Benchmarks print numbers; tests never time anything. `make bench` ends with the peer report.
bench: build bench-wal bench-feed bench-cluster bench-quorum bench-peers
	$(TIDAL) bench --spawn --workload signals --batch 1000 --concurrency 16 --seconds $(BENCH_SECONDS)
	$(TIDAL) bench --spawn --workload items --concurrency 64 --seconds $(BENCH_SECONDS)
	$(TIDAL) bench --spawn --workload embeddings --concurrency 64 --seconds $(BENCH_SECONDS)

# A 3-node local cluster (quorum): replication lag (ack -> visible on every follower) and ingest.
bench-cluster: build
	$(TIDAL) cluster up --dir ./target/bench-cluster --port-base 24070
	$(TIDAL) bench --url http://127.0.0.1:24070 --workload lag --concurrency 4 --seconds $(BENCH_SECONDS)
	$(TIDAL) bench --url http://127.0.0.1:24070 --workload signals --batch 1000 --concurrency 16 --seconds $(BENCH_SECONDS)
	$(TIDAL) cluster down --dir ./target/bench-cluster

# Quorum-mode ingest against one node, each node (the single one too) held to the same CPU quota
# through a cgroup (QUORUM_QUOTA cores; needs root), as on one machine per node: fresh single node
# and fresh 3-node cluster alternated, QUORUM_ROUNDS rounds, the ratio per round and its median.
# QUORUM_QUOTA=0 runs uncapped: the three nodes then share this machine's cores.
QUORUM_ROUNDS ?= 5
QUORUM_QUOTA ?= 0.5
bench-quorum: build
	TIDAL=$(TIDAL) QUOTA=$(QUORUM_QUOTA) SECONDS_PER_RUN=$(BENCH_SECONDS) bash bench/quorum_ingest.sh $(QUORUM_ROUNDS)

# The exit gates on a fresh local 3-node cluster (about 20 min; under 45): one line per gate,
# `gate <name>: <figure> (goal <goal>) PASS|FAIL`, then a summary; non-zero exit on any FAIL.
# Shorter knobs for a quick run: GATE_DOWN_SECONDS=60 GATE_FAILOVER_ROUNDS=5 GATE_SAMPLES=500 ...
# (see `tidal gates --help`); GATES=heal-100k,failover runs a subset.
gates: build peers-work
	$(TIDAL) gates --anchors $(ANCHORS) --anchors-work $(ANCHORS_WORK) --results $(REPORT_DIR)/gates.txt

# A guided tour: write, replicate, SIGKILL the leader, failover, restart, heal, equal digests.
demo: build
	$(TIDAL) demo

# Tidal's cluster and the peers (Redis, PostgreSQL, NATS JetStream, etcd) in the same sitting, then
# $(REPORT_DIR)/REPORT.md (table of ratios) and ratios.svg: writes, lag, catch-up, and the stream
# rows (publish, delivery to a follower's subscriber, reads). About 25 min; apt/pip installs the peers.
# Tidal's single-record writes go out on write links (decisions/073), as an application with many
# writers would send them through tidal-client's `Link`; LINKS=0 sends them over HTTP/1.1 instead.
LINKS ?= 2
# Each group of Tidal rows (writes, streams, inboxes) starts on a fresh cluster, as each peer
# script's phase starts on emptied data (Redis: FLUSHALL and rewritten AOFs): a group that ran
# after the others measured their background work too (2026-12-08: publishes at 0.6x their rate
# on a fresh cluster). `sync` first, so that the build's dirty pages are not written back under
# the first row's fsyncs.
FRESH_CLUSTER = $(TIDAL) cluster down --dir $(REPORT_DIR)/cluster 2>/dev/null || true; \
	rm -rf $(REPORT_DIR)/cluster; sync; \
	$(TIDAL) cluster up --dir $(REPORT_DIR)/cluster --port-base 27070
bench-peers: build peers-work
	mkdir -p $(REPORT_DIR)
	$(FRESH_CLUSTER)
	: > $(REPORT_DIR)/tidal-bench.md
	for c in 1 16 50; do \
	  $(TIDAL) bench --url http://127.0.0.1:27070 --workload items --links $(LINKS) --concurrency $$c --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md || exit 1; \
	done
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload signals --batch 100 --concurrency 16 --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md
	# Streams (issue 39), set against Redis XADD/XREAD BLOCK/XRANGE and NATS JetStream R3.
	$(FRESH_CLUSTER)
	for c in 1 16 50; do \
	  $(TIDAL) bench --url http://127.0.0.1:27070 --workload publish --batch 1 --links $(LINKS) --concurrency $$c --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md || exit 1; \
	done
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload publish --batch 100 --concurrency 16 --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload stream-lag --concurrency 4 --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload stream-read --concurrency 2 --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md
	# Inboxes (issue 40), set against Redis XADD/XREADGROUP/XACK and a NATS JetStream work queue.
	$(FRESH_CLUSTER)
	for c in 1 16; do \
	  $(TIDAL) bench --url http://127.0.0.1:27070 --workload inbox-roundtrip --concurrency $$c --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md || exit 1; \
	done
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload inbox-latency --seconds $(BENCH_SECONDS) | tee -a $(REPORT_DIR)/tidal-bench.md
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload inbox-drain --concurrency 32 --messages 10000 | tee -a $(REPORT_DIR)/tidal-bench.md
	$(TIDAL) cluster down --dir $(REPORT_DIR)/cluster
	# The same writes acknowledged after the leader's fsync alone: Redis's promise, set against it.
	$(TIDAL) cluster down --dir $(REPORT_DIR)/cluster-leader 2>/dev/null || true
	rm -rf $(REPORT_DIR)/cluster-leader
	$(TIDAL) cluster up --dir $(REPORT_DIR)/cluster-leader --port-base 27070 --durability leader
	$(TIDAL) bench --url http://127.0.0.1:27070 --workload items --links $(LINKS) --concurrency 50 --seconds $(BENCH_SECONDS) | tee $(REPORT_DIR)/tidal-bench-leader.md
	$(TIDAL) cluster down --dir $(REPORT_DIR)/cluster-leader
	-GATES=replication-lag,heal-100k GATE_DOWN_SECONDS=0 $(TIDAL) gates --anchors $(ANCHORS) --anchors-work $(ANCHORS_WORK) --results $(REPORT_DIR)/tidal-gates.txt
	# A peer that fails leaves "-" in the report; its output is in the results folder.
	-bash $(ANCHORS_WORK)/anchors/run-all.sh redis postgres nats etcd
	python3 bench/peer_report.py --tidal-bench $(REPORT_DIR)/tidal-bench.md --tidal-leader-bench $(REPORT_DIR)/tidal-bench-leader.md --tidal-gates $(REPORT_DIR)/tidal-gates.txt --anchors $(ANCHORS_WORK)/anchors/results --out $(REPORT_DIR)

# The writable copy of $(ANCHORS), refreshed from it on every use; its .venv and results/ stay.
peers-work:
	mkdir -p $(ANCHORS_WORK)/anchors
	tar -C $(ANCHORS) --exclude=./.venv --exclude=./results --exclude=__pycache__ -cf - . | tar -C $(ANCHORS_WORK)/anchors -xf -
	chmod -R u+w $(ANCHORS_WORK)/anchors

# Crash to ready (issue 43): Tidal's leader and a follower, Redis (AOF always) and PostgreSQL, each
# loaded at half its measured max rate for CRASH_SECONDS (30), SIGKILLed, restarted and timed until
# ready and caught up; CRASH_RUNS (3) alternated rounds, medians (about 12 min). Needs root for
# PostgreSQL (runs it as the postgres user); raw lines in target/bench-crash/.
bench-crash: build
	TIDAL=$(TIDAL) bash bench/crash/run.sh

bench-wal:
	$(CARGO) run --release -p tidal-wal --example wal_bench -- --seconds 3

bench-feed:
	$(CARGO) run --release -p tidal-core --example feed_bench

# Startup replay: writes a WAL (untimed), opens a node on it with an empty engine, prints replay
# MB/s and events/s per run and the median (experiments/013). REPLAY_WORKLOAD: signals|items|embeddings.
REPLAY_WORKLOAD ?= signals
REPLAY_MB ?= 256
bench-replay:
	$(CARGO) run --release -p tidal-server --example replay_bench -- $(REPLAY_WORKLOAD) $(REPLAY_MB) 3

# Offline checks of deploy/ (deploy/check.sh): the systemd unit (systemd-analyze verify), the compose
# file (docker-compose config and its pieces against each other), the Dockerfile (BuildKit's
# parser), the Kubernetes manifests against the API's schemas (kubernetes-validate --strict), the
# Prometheus rules and their unit tests (promtool); then, with the test-profile binary in private
# namespaces (root), the compose pieces (tidal-init, the node commands, healthchecks) and the
# Kubernetes start script (three "pods", scaled to four and back) run for real. No Docker
# engine or API server needed; .ci/run installs the tools. The metric names the rules and the
# dashboard use are checked by a test in `make test` (crates/tidal-cli/tests/t81_deploy_metrics.rs).
.PHONY: deploy-check
deploy-check:
	$(CARGO) build --profile test -p tidal-cli --bin tidal
	TIDAL=$(or $(CARGO_TARGET_DIR),target)/debug/tidal bash deploy/check.sh

clean:
	$(CARGO) clean
