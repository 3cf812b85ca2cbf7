#!/usr/bin/env bash
# Quorum-mode ingest against single-node ingest, with every node given the same CPU.
#
# On one machine the three nodes of a local cluster share its cores, and every node folds every
# signal, so the cluster competes with itself for CPU a real deployment (one node per machine) would
# not. This bench gives each node, the single node included, the same CPU quota through a cgroup
# (`QUOTA` cores, default 0.5: three nodes take 1.5 of this machine's 2 cores and leave the rest to
# the load generator), so the ratio measures what replication costs a node rather than how three
# nodes share one machine. QUOTA=0 runs uncapped (the shared-machine figure).
#
# Each round starts a fresh single node and a fresh 3-node cluster (quorum durability), in
# alternating order, and drives each with the same `tidal bench` signal load against the leader.
# Prints one line per run, then the ratio per round and its median.
#
#   bash bench/quorum_ingest.sh [ROUNDS]          (env: TIDAL, QUOTA, SECONDS_PER_RUN, BATCH,
#                                                  CONCURRENCY, PORT_BASE, WORK)
#
# Needs root for the cgroup (v1 `cpu` controller or v2 with `cpu` enabled); without it, set QUOTA=0.
set -euo pipefail
# The runs happen in command substitutions: a failure inside one must end the script too.
shopt -s inherit_errexit

ROUNDS=${1:-3}
TIDAL=${TIDAL:-target/release/tidal}
QUOTA=${QUOTA:-0.5}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
BATCH=${BATCH:-1000}
CONCURRENCY=${CONCURRENCY:-16}
PORT_BASE=${PORT_BASE:-27370}
# A work dir this script made is removed at the end; one given in WORK is kept.
if [[ -n ${WORK:-} ]]; then OWN_WORK=""; else WORK=$(mktemp -d /tmp/tidal-quorum-ingest.XXXXXX); OWN_WORK=1; fi
PERIOD_US=100000

[[ -x $TIDAL ]] || { echo "quorum_ingest: no tidal binary at $TIDAL (make build, or set TIDAL)" >&2; exit 2; }
mkdir -p "$WORK"

# The cgroup root for CPU quotas, and how to set one: v2 (cpu.max) or v1 (cpu.cfs_quota_us).
CGROOT=""
if [[ $QUOTA != 0 ]]; then
  quota_us=$(python3 -c "print(int(float('$QUOTA') * $PERIOD_US))")
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]] && grep -qw cpu /sys/fs/cgroup/cgroup.controllers; then
    CGROOT=/sys/fs/cgroup/tidal-quorum-ingest-$$
    mkdir "$CGROOT"
    grep -qw cpu "$CGROOT/../cgroup.subtree_control" || echo +cpu > "$CGROOT/../cgroup.subtree_control"
    echo +cpu > "$CGROOT/cgroup.subtree_control"
    CGMODE=v2
  elif [[ -d /sys/fs/cgroup/cpu ]]; then
    CGROOT=/sys/fs/cgroup/cpu/tidal-quorum-ingest-$$
    mkdir "$CGROOT"
    CGMODE=v1
  else
    echo "quorum_ingest: no cgroup cpu controller here; run with QUOTA=0 (uncapped)" >&2
    exit 2
  fi
fi

# The runs happen in command substitutions (subshells, which do not run this trap), so the single
# node's PID is kept in a file for the cleanup to find.
cleanup() {
  if [[ -f $WORK/single.pid ]]; then
    local pid
    pid=$(cat "$WORK/single.pid")
    kill "$pid" 2>/dev/null || true
    # Not our child here: wait for it to exit before its cgroup can be removed.
    for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  fi
  "$TIDAL" cluster down --dir "$WORK/cluster" >/dev/null 2>&1 || true
  if [[ -n $CGROOT ]]; then
    # A group can be removed once empty; the nodes above are gone by now.
    for group in "$CGROOT"/*/; do [[ -d $group ]] && rmdir "$group" 2>/dev/null; done
    rmdir "$CGROOT" 2>/dev/null || true
  fi
  if [[ -n $OWN_WORK ]]; then rm -rf "$WORK"; fi
}
trap cleanup EXIT

# cap NAME PID: puts the process (all its threads) in its own group with the quota.
cap() {
  [[ -z $CGROOT ]] && return 0
  local group=$CGROOT/$1
  mkdir -p "$group"
  if [[ $CGMODE == v2 ]]; then
    echo "$quota_us $PERIOD_US" > "$group/cpu.max"
  else
    echo "$PERIOD_US" > "$group/cpu.cfs_period_us"
    echo "$quota_us" > "$group/cpu.cfs_quota_us"
  fi
  echo "$2" > "$group/cgroup.procs"
}

# bench URL: events/s of one signal run.
bench() {
  local row
  row=$("$TIDAL" bench --url "$1" --workload signals --batch "$BATCH" --concurrency "$CONCURRENCY" \
    --seconds "$SECONDS_PER_RUN" 2>"$WORK/bench.err" | grep -E '^\| Signals' | tail -1) || true
  [[ -n $row ]] || { echo "quorum_ingest: the bench against $1 printed no result:" >&2; head -3 "$WORK/bench.err" >&2; exit 1; }
  local errors
  errors=$(echo "$row" | awk -F'|' '{print $6+0}')
  [[ $errors == 0 ]] || { echo "quorum_ingest: $errors failed requests against $1" >&2; exit 1; }
  echo "$row" | awk -F'|' '{print $9+0}'
}

wait_ready() {
  for _ in $(seq 300); do
    curl -sf "$1/readyz" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "quorum_ingest: $1 not ready after 30 s" >&2
  exit 1
}

single() {
  local dir=$WORK/single-$1 url=http://127.0.0.1:$((PORT_BASE + 10))
  rm -rf "$dir"
  "$TIDAL" serve --data-dir "$dir" --http "127.0.0.1:$((PORT_BASE + 10))" > "$WORK/single-$1.log" 2>&1 &
  local pid=$!
  echo "$pid" > "$WORK/single.pid"
  wait_ready "$url"
  cap single "$pid"
  local rate
  rate=$(bench "$url")
  kill "$pid"
  wait "$pid" || true
  rm -f "$WORK/single.pid"
  echo "$rate"
}

cluster() {
  local dir=$WORK/cluster
  "$TIDAL" cluster down --dir "$dir" >/dev/null 2>&1 || true
  rm -rf "$dir"
  "$TIDAL" cluster up --dir "$dir" --port-base "$PORT_BASE" > "$WORK/cluster-up-$1.log"
  for i in 1 2 3; do cap "n$i" "$(cat "$dir/n$i.pid")"; done
  # The leader's URL from any node's status: writes go to it, as a client's would after a redirect.
  local url
  url=http://$(curl -sf "http://127.0.0.1:$PORT_BASE/cluster/status" | python3 -c '
import json, sys
status = json.load(sys.stdin)
print(next(node["http"] for node in status["nodes"] if node["id"] == status["leader_id"]))')
  local rate
  rate=$(bench "$url")
  "$TIDAL" cluster down --dir "$dir" >/dev/null
  echo "$rate"
}

echo "quorum_ingest: $ROUNDS rounds, ${SECONDS_PER_RUN} s runs, batches of $BATCH signals, $CONCURRENCY clients," \
  "CPU per node: $( [[ $QUOTA == 0 ]] && echo 'uncapped (shared)' || echo "$QUOTA cores ($CGMODE cgroup)" ); work dir $WORK"
ratios=()
for round in $(seq "$ROUNDS"); do
  if (( round % 2 )); then
    s=$(single "$round"); c=$(cluster "$round")
  else
    c=$(cluster "$round"); s=$(single "$round")
  fi
  ratio=$(python3 -c "print(f'{$c / $s * 100:.0f}')")
  ratios+=("$ratio")
  echo "round $round: single node $s events/s, 3-node quorum cluster $c events/s: $ratio%"
done
median=$(printf '%s\n' "${ratios[@]}" | sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}')
echo "quorum_ingest: median ratio $median% of single-node ingest over $ROUNDS rounds (goal >= 70%)"
