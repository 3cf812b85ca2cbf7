#!/usr/bin/env bash
# Redis 7: a primary and two replicas on 127.0.0.1, AOF on every node with `appendfsync always`.
# A SET is acknowledged once the primary has appended it to its AOF and fsynced it; replication
# is asynchronous, so the ack says nothing about the replicas (WAIT would).
#   bash bench/peers/redis/run.sh            (about 2 min)
# Phases (PHASES, default "bench lag catchup"):
#   bench   redis-benchmark SET against the primary: SIZES x PIPELINES, CLIENTS connections,
#           about BENCH_SECONDS each; then how long the replicas took to catch up.
#   lag     under a background redis-benchmark load, LAG_WRITES sequential SETs, each followed
#           by GETs on replica 1 until it shows: ack -> visible (the `kind=redis-lag` line).
#   catchup replica 2 misses CATCHUP_RECORDS XADDs, then returns; time until its offset matches.
#           CATCHUP_CASES: "restart:1mb" (stopped, restarted: Redis 7.0 then resyncs in full)
#           and "pause:512mb" (SIGSTOPped and its link cut: a partial resync from the backlog).
# Env: BENCH_SECONDS (8), CLIENTS (50), SIZES ("100"), PIPELINES ("1 16"), LAG_WRITES (1000),
#      CATCHUP_RECORDS (100000), RECORD_BYTES (200), REPLICA_FSYNC (always), PORT_BASE (17101)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require redis-server redis-cli redis-benchmark
require_venv
PHASES="${PHASES:-bench lag catchup}"
BENCH_SECONDS="${BENCH_SECONDS:-8}"
CLIENTS="${CLIENTS:-50}"
SIZES="${SIZES:-100}"
PIPELINES="${PIPELINES:-1 16}"
LAG_WRITES="${LAG_WRITES:-1000}"
CATCHUP_RECORDS="${CATCHUP_RECORDS:-100000}"
RECORD_BYTES="${RECORD_BYTES:-200}"
CATCHUP_CASES="${CATCHUP_CASES:-restart:1mb pause:512mb}"
REPLICA_FSYNC="${REPLICA_FSYNC:-always}"
PROBE=("$PEERS_PY" "$PEERS_ROOT/redis/probe.py")
wants() { [[ " $PHASES " == *" $1 "* ]]; }

new_scratch redis
machine
redis-server --version
free_ports FIRST "${PORT_BASE:-17101}" 3
PORT=("$FIRST" $((FIRST + 1)) $((FIRST + 2)))
declare -a PID=()
cli() { local port="$1"; shift; timeout 30 redis-cli -h 127.0.0.1 -p "$port" "$@"; }

node_up() {  # node_up INDEX FOLDER : start node INDEX from FOLDER/redis.conf (written if missing)
  local i="$1" dir="$2"
  if [[ ! -f "$dir/redis.conf" ]]; then
    mkdir -p "$dir"
    {
      echo "bind 127.0.0.1"
      echo "port ${PORT[$i]}"
      echo "dir $dir"
      echo "logfile $dir/redis.log"
      echo "daemonize no"
      echo 'save ""'
      echo "appendonly yes"
      if ((i == 0)); then
        echo "appendfsync always"
      else
        echo "appendfsync $REPLICA_FSYNC"
        echo "replicaof 127.0.0.1 ${PORT[0]}"
      fi
    } >"$dir/redis.conf"
  fi
  redis-server "$dir/redis.conf" &
  PID[$i]=$!
  own "${PID[$i]}"
  poll 20 cli "${PORT[$i]}" ping || fail "redis node $i did not answer on ${PORT[$i]}"
}
online_replicas() { cli "${PORT[0]}" info replication | grep -c 'state=online'; }
both_online() { (($(online_replicas) >= 2)); }
cluster_up() {  # cluster_up NAME : three fresh nodes under $SCRATCH/NAME
  local i
  for i in 0 1 2; do node_up "$i" "$SCRATCH/$1/node$i"; done
  poll 60 both_online || fail "the replicas did not come online"
}
cluster_down() { local i; for i in 2 1 0; do halt "${PID[$i]}" 20; done; }
resyncs() {  # resyncs CLUSTER : full resyncs since the replicas first synced, from their logs
  local seen
  seen="$(cat "$SCRATCH/$1"/node{1,2}/redis.log 2>/dev/null | grep -c 'Full resync from master' || true)"
  echo $((seen - 2))
}

declare -a BENCH_ROWS=() CATCHUP_ROWS=()
LAG_LINE=""
if wants bench || wants lag; then
  note "primary on ${PORT[0]}, replicas on ${PORT[1]} and ${PORT[2]}"
  cluster_up main
fi

if wants bench; then
  for size in $SIZES; do
    for pipeline in $PIPELINES; do
      # A short run first, to size the measured one to about BENCH_SECONDS (bounded either way).
      rate="$(timeout 60 redis-benchmark -h 127.0.0.1 -p "${PORT[0]}" -t set -c "$CLIENTS" -P "$pipeline" \
        -d "$size" -r 100000 -n 5000 --csv | awk -F, '$1 == "\"SET\"" {gsub(/"/, "", $2); print int($2)}')"
      requests=$(( ${rate:-1000} * BENCH_SECONDS ))
      ((requests < 5000)) && requests=5000
      ((requests > 3000000)) && requests=3000000
      note "redis-benchmark SET ${size} B, pipeline $pipeline, $CLIENTS clients, $requests requests"
      csv="$(timeout $((BENCH_SECONDS * 6 + 60)) redis-benchmark -h 127.0.0.1 -p "${PORT[0]}" -t set \
        -c "$CLIENTS" -P "$pipeline" -d "$size" -r 100000 -n "$requests" --csv | grep '^"SET"' | tr -d '"')"
      echo "  $csv"
      # rps, avg, min, p50, p95, p99, max
      IFS=, read -r _ ops _ _ p50 _ p99 max <<<"$csv"
      drain="$("${PROBE[@]}" drained --primary "${PORT[0]}" --replicas "${PORT[1]},${PORT[2]}")"
      echo "  $drain"
      caught="$(field "$drain" seconds)"
      [[ "$(field "$drain" drained)" == yes ]] || caught="$caught (not caught up)"
      BENCH_ROWS+=("| SET $size B | $pipeline | $CLIENTS | $ops | $p50 | $p99 | $max | $requests | $caught | $(resyncs main) |")
      cli "${PORT[0]}" flushall >/dev/null
    done
  done
fi

if wants lag; then
  poll 120 both_online || fail "the replicas are not online before the lag phase"
  # Start from small AOFs so that no automatic rewrite lands in the middle of the samples.
  cli "${PORT[0]}" flushall >/dev/null
  for i in 0 1 2; do cli "${PORT[$i]}" bgrewriteaof >/dev/null 2>&1 || true; done
  rewriting() { local i; for i in 0 1 2; do cli "${PORT[$i]}" info persistence | grep -q '^aof_rewrite_in_progress:1' && return 0; done; return 1; }
  no_rewrite() { ! rewriting; }
  poll 120 no_rewrite || note "AOF rewrites still running; going on"
  note "lag: $LAG_WRITES writes, each read back on replica 1, under 20 background SET clients"
  timeout 150 redis-benchmark -h 127.0.0.1 -p "${PORT[0]}" -t set -c 20 -d 100 -r 100000 -n 3000000 -q \
    >"$SCRATCH/background.log" 2>&1 &
  LOAD=$!
  own "$LOAD"
  sleep 2
  LAG_LINE="$("${PROBE[@]}" lag --primary "${PORT[0]}" --replica "${PORT[1]}" --writes "$LAG_WRITES" --max-seconds 90)"
  echo "  $LAG_LINE"
  halt "$LOAD" 5
fi
if wants bench || wants lag; then
  echo "  full resyncs seen by the replicas: $(resyncs main)"
  cluster_down
fi

catchup_case() {  # catchup_case HOW BACKLOG
  local how="$1" backlog="$2" name="catchup-$1" before after fill since result kind link
  note "catch-up ($how, repl-backlog-size $backlog): replica 2 misses $CATCHUP_RECORDS XADDs of $RECORD_BYTES B"
  cluster_up "$name"
  cli "${PORT[0]}" config set repl-backlog-size "$backlog" >/dev/null
  cli "${PORT[0]}" set peers:warm 1 >/dev/null
  before="$("${PROBE[@]}" counters --port "${PORT[0]}")"
  if [[ $how == restart ]]; then
    halt "${PID[2]}" 20
  else
    link="$(cli "${PORT[2]}" client list type master | grep -o 'laddr=[0-9.:]*' | cut -d= -f2)"
    kill -STOP "${PID[2]}"
    cli "${PORT[0]}" client kill addr "$link" >/dev/null || true
    sleep 1
  fi
  fill="$("${PROBE[@]}" fill --port "${PORT[0]}" --records "$CATCHUP_RECORDS" --bytes "$RECORD_BYTES")"
  echo "  $fill"
  since="$(date +%s.%N)"
  if [[ $how == restart ]]; then
    redis-server "$SCRATCH/$name/node2/redis.conf" &
    PID[2]=$!
    own "${PID[2]}"
  else
    kill -CONT "${PID[2]}"
  fi
  result="$("${PROBE[@]}" catchup --primary "${PORT[0]}" --replica "${PORT[2]}" --since "$since")"
  echo "  $result"
  after="$("${PROBE[@]}" counters --port "${PORT[0]}")"
  if (($(field "$after" sync_full) > $(field "$before" sync_full))); then
    kind="full resync"
  elif (($(field "$after" sync_partial_ok) > $(field "$before" sync_partial_ok))); then
    kind="partial resync (backlog)"
  else
    kind="unknown"
  fi
  echo "  resync: $kind ($before -> $after)"
  CATCHUP_ROWS+=("| $how | $backlog | $CATCHUP_RECORDS x $RECORD_BYTES B | $(field "$fill" records_per_s) | $(field "$result" link_up_s) | $(field "$result" caught_up_s) | $(field "$result" caught_up) | $kind |")
  cluster_down
}
if wants catchup; then
  for case in $CATCHUP_CASES; do catchup_case "${case%%:*}" "${case#*:}"; done
fi

echo
echo "== redis $(redis-server --version | grep -o 'v=[0-9.]*' | cut -d= -f2): primary + 2 asynchronous replicas, appendonly yes, appendfsync always (replicas: $REPLICA_FSYNC) ($(date -u +%FT%TZ)) =="
if wants bench; then
  echo "| workload | pipeline | clients | ops/s | p50 ms | p99 ms | max ms | requests | replicas caught up after, s | full resyncs so far (after the first sync) |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${BENCH_ROWS[@]}"
  echo
fi
if wants lag; then
  echo "| replication lag (ack on the primary -> visible on replica 1), primary at $(field "$LAG_LINE" primary_cmds_per_s_during) cmds/s meanwhile | figure |"
  echo "|---|---|"
  echo "| writes sampled (timeouts) | $(field "$LAG_LINE" writes) ($(field "$LAG_LINE" timeouts)) |"
  echo "| visible after ack p50 / p99 / max ms | $(field "$LAG_LINE" vis_after_ack_p50_ms) / $(field "$LAG_LINE" vis_after_ack_p99_ms) / $(field "$LAG_LINE" vis_after_ack_max_ms) |"
  echo "| SET sent -> visible on replica 1 p50 / p99 ms | $(field "$LAG_LINE" sent_to_visible_p50_ms) / $(field "$LAG_LINE" sent_to_visible_p99_ms) |"
  echo "| SET + WAIT $(field "$LAG_LINE" wait_all_replicas) 1000 (every replica has it) p50 / p99 ms | $(field "$LAG_LINE" wait_all_p50_ms) / $(field "$LAG_LINE" wait_all_p99_ms) (short: $(field "$LAG_LINE" wait_all_short)) |"
  echo "| samples over 100 ms | $(field "$LAG_LINE" slow_count) |"
  echo
fi
if wants catchup; then
  echo "| catch-up mode | repl-backlog-size | records missed | write rate rec/s | link up after s | caught up after s | caught up | resync |"
  echo "|---|---|---|---:|---:|---:|---|---|"
  printf '%s\n' "${CATCHUP_ROWS[@]}"
fi
