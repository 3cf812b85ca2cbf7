#!/usr/bin/env bash
# Two tidal binaries against each other on the same machine in the same sitting: a change's cost.
#
# Each round runs every (durability, clients) case on a fresh local 3-node cluster, first with one
# binary and then with the other (the order alternates from round to round, so a machine that gets
# busier or quieter during the sitting weighs on both alike), and drives the leader with
# `tidal bench --workload items` (one durable single-record write per request). Prints one line per
# run, then per case the median writes/s and ack p99 of each binary and the ratio after/before.
#
#   bash bench/ab.sh BEFORE_BINARY AFTER_BINARY      (env: ROUNDS=3, SECONDS_PER_RUN=8,
#                                                    CLIENTS="1 16", DURABILITIES="quorum leader",
#                                                    PORT_BASE=27470)
#
# Build the "before" binary from a worktree of the older commit with its own CARGO_TARGET_DIR.
set -euo pipefail
shopt -s inherit_errexit

[[ $# -eq 2 ]] || { echo "usage: bash bench/ab.sh BEFORE_BINARY AFTER_BINARY" >&2; exit 2; }
BEFORE=$1
AFTER=$2
ROUNDS=${ROUNDS:-3}
SECONDS_PER_RUN=${SECONDS_PER_RUN:-8}
CLIENTS=${CLIENTS:-"1 16"}
DURABILITIES=${DURABILITIES:-"quorum leader"}
PORT_BASE=${PORT_BASE:-27470}
for binary in "$BEFORE" "$AFTER"; do
  [[ -x $binary ]] || { echo "ab: no executable at $binary" >&2; exit 2; }
done

WORK=$(mktemp -d /tmp/tidal-ab.XXXXXX)
RESULTS=$WORK/results.tsv
CLUSTER=""
CLUSTER_BINARY=""
cleanup() {
  if [[ -n $CLUSTER ]]; then "$CLUSTER_BINARY" cluster down --dir "$CLUSTER" >/dev/null 2>&1 || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

# One run: a fresh cluster with `binary`, one bench against its leader, the cluster stopped.
# Appends "label durability clients writes/s p99_ms" to the results.
run() {
  local label=$1 binary=$2 durability=$3 clients=$4
  CLUSTER=$WORK/cluster-$label
  CLUSTER_BINARY=$binary
  rm -rf "$CLUSTER"
  "$binary" cluster up --nodes 3 --dir "$CLUSTER" --port-base "$PORT_BASE" --durability "$durability" >/dev/null
  local row
  row=$("$binary" bench --url "http://127.0.0.1:$PORT_BASE" --workload items --concurrency "$clients" \
    --seconds "$SECONDS_PER_RUN" 2>/dev/null | grep -i '^| items')
  "$binary" cluster down --dir "$CLUSTER" >/dev/null
  CLUSTER=""
  # | workload | concurrency | batch | requests | errors | seconds | requests/s | events/s | p50 | p99 | max |
  local rate p99
  rate=$(awk -F'|' '{gsub(/ /, "", $8); print $8}' <<<"$row")
  p99=$(awk -F'|' '{gsub(/ /, "", $11); print $11}' <<<"$row")
  printf '%s\t%s\t%s\t%s\t%s\n' "$label" "$durability" "$clients" "$rate" "$p99" | tee -a "$RESULTS"
}

for round in $(seq 1 "$ROUNDS"); do
  for durability in $DURABILITIES; do
    for clients in $CLIENTS; do
      if (( round % 2 )); then
        run before "$BEFORE" "$durability" "$clients"
        run after "$AFTER" "$durability" "$clients"
      else
        run after "$AFTER" "$durability" "$clients"
        run before "$BEFORE" "$durability" "$clients"
      fi
    done
  done
done

python3 - "$RESULTS" <<'EOF'
import statistics, sys
rows = [line.split("\t") for line in open(sys.argv[1]).read().splitlines()]
cases = sorted({(d, int(c)) for _, d, c, _, _ in rows}, key=lambda case: (case[0] != "quorum", case[1]))
print("| durability, clients | before: writes/s, ack p99 | after: writes/s, ack p99 | after / before |")
print("|---|---|---|---|")
for durability, clients in cases:
    def median(label, column):
        return statistics.median(float(r[column]) for r in rows if r[0] == label and r[1] == durability and int(r[2]) == clients)
    before, after = median("before", 3), median("after", 3)
    print(f"| {durability}, {clients} | {before:,.0f}, {median('before', 4):.2f} ms | {after:,.0f}, {median('after', 4):.2f} ms | {after / before:.2f} |")
EOF
