#!/usr/bin/env bash
# Runs the peer scripts one after another and keeps each one's whole output in
# results/run-<UTC time>/<peer>.txt beside this file (bench/peer_report.py reads the newest).
#   bash bench/peers/run-all.sh                    # physical redis postgres nats etcd (~11 min)
#   bash bench/peers/run-all.sh physical redis     # the ones named, in that order
# setup.sh runs first. A peer that fails does not stop the others; the exit code is non-zero
# if any did. PEER_TIMEOUT (seconds, 600) bounds each peer from outside, on top of its own bounds.
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
ALL=(physical redis postgres nats etcd)
if (($# > 0)); then WANTED=("$@"); else WANTED=("${ALL[@]}"); fi

bash "$ROOT/setup.sh" || { echo "run-all: setup.sh failed" >&2; exit 1; }
RUN_DIR="$ROOT/results/run-$(date -u +%Y%m%dT%H%M%SZ)"
mkdir -p "$RUN_DIR"
declare -a SUMMARY=()
failed=0
CURRENT=""
# Ctrl-C or a TERM: stop the running peer (its script stops its servers), then leave.
trap 'if [[ -n "$CURRENT" ]]; then kill -TERM "$CURRENT" 2>/dev/null; wait "$CURRENT" 2>/dev/null; fi; exit 130' INT TERM
for peer in "${WANTED[@]}"; do
  if [[ ! -f "$ROOT/$peer/run.sh" ]]; then
    SUMMARY+=("| $peer | no such peer script | - |")
    failed=1
    continue
  fi
  printf '\n######## %s ########\n' "$peer"
  began=$SECONDS
  # timeout (not --foreground) signals its whole process group: the script and what it started.
  # In the background so that a signal to this script reaches the trap above at once.
  timeout "${PEER_TIMEOUT:-600}" bash "$ROOT/$peer/run.sh" > >(tee "$RUN_DIR/$peer.txt") 2>&1 &
  CURRENT=$!
  wait "$CURRENT"
  code=$?
  CURRENT=""
  ((code == 0)) || failed=1
  SUMMARY+=("| $peer | exit $code | $((SECONDS - began)) s |")
  sleep 2  # a breath between peers for writeback and the CPU
done
printf '\n== run-all: outputs in %s ==\n' "$RUN_DIR"
echo "| peer | result | took |"
echo "|---|---|---:|"
printf '%s\n' "${SUMMARY[@]}"
exit "$failed"
