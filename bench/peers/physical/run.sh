#!/usr/bin/env bash
# The machine's physical limits: durable appends per second (write + fdatasync, one writer),
# sequential write bandwidth to disk, and the TCP round trip on loopback. About 40 s.
#   bash bench/peers/physical/run.sh
# Env: SYNC_SECONDS (per fsync case, 5), SEQ_MIB (1024), RTT_SECONDS (5)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require_venv
SYNC_SECONDS="${SYNC_SECONDS:-5}"
SEQ_MIB="${SEQ_MIB:-1024}"
RTT_SECONDS="${RTT_SECONDS:-5}"
PROBE=("$PEERS_PY" "$PEERS_ROOT/physical/limits.py")
new_scratch physical
machine

declare -a SYNC_ROWS=()
for case in "append 4096" "append 65536" "append 1048576" "overwrite 4096" "overwrite 65536"; do
  read -r mode block <<<"$case"
  note "fdatasync loop: $mode, $block-byte writes, ${SYNC_SECONDS}s"
  line="$("${PROBE[@]}" fsync --dir "$SCRATCH" --mode "$mode" --block "$block" --max-seconds "$SYNC_SECONDS")"
  echo "  $line"
  SYNC_ROWS+=("| write + fdatasync, $mode | $block | $(field "$line" syncs_per_s) | $(field "$line" mb_per_s) | $(field "$line" p50_us) | $(field "$line" p99_us) | $(field "$line" max_us) |")
done

note "sequential write: ${SEQ_MIB} MiB in 1 MiB writes, one fdatasync at the end"
seq_line="$("${PROBE[@]}" seq --dir "$SCRATCH" --total $((SEQ_MIB << 20)) --max-seconds 60)"
echo "  $seq_line"

note "loopback round trip: 100-byte request/response, ${RTT_SECONDS}s"
rtt_line="$("${PROBE[@]}" rtt --size 100 --max-seconds "$RTT_SECONDS")"
echo "  $rtt_line"

echo
echo "== physical limits of this machine ($(date -u +%FT%TZ)) =="
echo "| durable append (one writer) | bytes per write | syncs/s | MB/s | p50 us | p99 us | max us |"
echo "|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${SYNC_ROWS[@]}"
echo
echo "| limit | figure |"
echo "|---|---|"
echo "| sequential write, $(( $(field "$seq_line" bytes) >> 20 )) MiB then one fdatasync | $(field "$seq_line" disk_mb_per_s) MB/s to disk ($(field "$seq_line" page_cache_mb_per_s) MB/s into the page cache; the sync took $(field "$seq_line" sync_s) s) |"
echo "| loopback TCP round trip, 100 B | p50 $(field "$rtt_line" p50_us) us, p99 $(field "$rtt_line" p99_us) us ($(field "$rtt_line" trips_per_s) round trips/s, Python at both ends) |"
