#!/usr/bin/env bash
# Redis 7: a primary and two replicas on 127.0.0.1, AOF on every node with `appendfsync always`.
# A SET is acknowledged once the primary has appended it to its AOF and fsynced it; replication
# is asynchronous, so the ack says nothing about the replicas (WAIT would).
#   bash bench/peers/redis/run.sh            (about 3 min)
# Phases (PHASES, default "bench lag catchup streams queue"; "streams" = the three stream-* phases):
#   bench   redis-benchmark SET against the primary: SIZES x PIPELINES, CLIENTS connections,
#           about BENCH_SECONDS each; then how long the replicas took to catch up.
#   lag     under a background redis-benchmark load, LAG_WRITES sequential SETs, each followed
#           by GETs on replica 1 until it shows: ack -> visible (the `kind=redis-lag` line).
#   catchup replica 2 misses CATCHUP_RECORDS XADDs, then returns; time until its offset matches.
#           CATCHUP_CASES: "restart:1mb" (stopped, restarted: Redis 7.0 then resyncs in full)
#           and "pause:512mb" (SIGSTOPped and its link cut: a partial resync from the backlog).
#   stream-publish  redis-benchmark XADD (EVENT_BYTES values) to one stream on the primary: one
#           XADD per request at each of STREAM_CLIENTS, then STREAM_BATCH XADDs pipelined per round
#           trip at STREAM_BATCH_CLIENTS; about STREAM_SECONDS each; then the replicas' catch-up.
#   stream-lag      probe.py delivery: DELIVERY_EVENTS XADDs at DELIVERY_RATE/s on the primary, a
#           reader in XREAD BLOCK on each replica: XADD reply -> read on the replicas.
#   stream-read     READ_EVENTS entries (ids 1-0, 2-0, ...), then redis-benchmark XRANGE pages of
#           READ_PAGE from a random id, READ_CLIENTS connections, about STREAM_SECONDS.
#   queue   (after the others, on a fresh cluster of its own) a work queue on a stream with
#           one consumer group, on the primary (probe.py queue, queue-latency, queue-drain):
#           QUEUE_PAIRS threads each XADD, XREADGROUP COUNT 1 BLOCK, XACK for about QUEUE_SECONDS;
#           QUEUE_SAMPLES sends to a receiver parked in XREADGROUP BLOCK (send -> receive);
#           QUEUE_MESSAGES entries drained by one consumer, QUEUE_BATCH per XREADGROUP + XACK.
# Env: BENCH_SECONDS (8), CLIENTS (50), SIZES ("100"), PIPELINES ("1 16"), LAG_WRITES (1000),
#      CATCHUP_RECORDS (100000), RECORD_BYTES (200), REPLICA_FSYNC (always), PORT_BASE (17101),
#      STREAM_SECONDS (BENCH_SECONDS), STREAM_CLIENTS ("1 16 50"), STREAM_BATCH (100),
#      STREAM_BATCH_CLIENTS (16), EVENT_BYTES (100), DELIVERY_EVENTS (2000), DELIVERY_RATE (200),
#      READ_EVENTS (200000), READ_PAGE (1000), READ_CLIENTS (2), QUEUE_PAIRS ("1 16"),
#      QUEUE_SECONDS (8), QUEUE_SAMPLES (300), QUEUE_GAP_MS (10), QUEUE_MESSAGES (10000),
#      QUEUE_BATCH (1000)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require redis-server redis-cli redis-benchmark
require_venv
PHASES="${PHASES:-bench lag catchup streams queue}"
BENCH_SECONDS="${BENCH_SECONDS:-8}"
CLIENTS="${CLIENTS:-50}"
SIZES="${SIZES:-100}"
PIPELINES="${PIPELINES:-1 16}"
LAG_WRITES="${LAG_WRITES:-1000}"
CATCHUP_RECORDS="${CATCHUP_RECORDS:-100000}"
RECORD_BYTES="${RECORD_BYTES:-200}"
CATCHUP_CASES="${CATCHUP_CASES:-restart:1mb pause:512mb}"
REPLICA_FSYNC="${REPLICA_FSYNC:-always}"
STREAM_SECONDS="${STREAM_SECONDS:-$BENCH_SECONDS}"
STREAM_CLIENTS="${STREAM_CLIENTS:-1 16 50}"
STREAM_BATCH="${STREAM_BATCH:-100}"
STREAM_BATCH_CLIENTS="${STREAM_BATCH_CLIENTS:-16}"
EVENT_BYTES="${EVENT_BYTES:-100}"
DELIVERY_EVENTS="${DELIVERY_EVENTS:-2000}"
DELIVERY_RATE="${DELIVERY_RATE:-200}"
READ_EVENTS="${READ_EVENTS:-200000}"
READ_PAGE="${READ_PAGE:-1000}"
READ_CLIENTS="${READ_CLIENTS:-2}"
QUEUE_PAIRS="${QUEUE_PAIRS:-1 16}"
QUEUE_SECONDS="${QUEUE_SECONDS:-8}"
QUEUE_SAMPLES="${QUEUE_SAMPLES:-300}"
QUEUE_GAP_MS="${QUEUE_GAP_MS:-10}"
QUEUE_MESSAGES="${QUEUE_MESSAGES:-10000}"
QUEUE_BATCH="${QUEUE_BATCH:-1000}"
PROBE=("$PEERS_PY" "$PEERS_ROOT/redis/probe.py")
wants() { [[ " $PHASES " == *" $1 "* || ($1 == stream-* && " $PHASES " == *" streams "*) ]]; }
wants_any() { local phase; for phase in "$@"; do wants "$phase" && return 0; done; return 1; }
STREAM_PHASES=(stream-publish stream-lag stream-read)
((READ_EVENTS > READ_PAGE)) || fail "READ_EVENTS ($READ_EVENTS) must exceed READ_PAGE ($READ_PAGE)"

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

# small_aofs : empty the data set and rewrite every AOF, so that no automatic rewrite lands in the
# middle of the samples that follow.
small_aofs() {
  local i
  cli "${PORT[0]}" flushall >/dev/null
  poll 120 both_online || note "the replicas are not both online; going on"
  for i in 0 1 2; do cli "${PORT[$i]}" bgrewriteaof >/dev/null 2>&1 || true; done
  poll 120 no_rewrite || note "AOF rewrites still running; going on"
}
rewriting() { local i; for i in 0 1 2; do cli "${PORT[$i]}" info persistence | grep -q '^aof_rewrite_in_progress:1' && return 0; done; return 1; }
no_rewrite() { ! rewriting; }

declare -a BENCH_ROWS=() CATCHUP_ROWS=() PUBLISH_ROWS=() READ_ROWS=() QUEUE_ROWS=()
LAG_LINE=""
DELIVERY_LINE=""
QUEUE_LATENCY_LINE=""
QUEUE_DRAIN_LINE=""
if wants_any bench lag "${STREAM_PHASES[@]}"; then
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
  small_aofs
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

# sized_requests CALIBRATION CLIENTS PIPELINE [ARG...] : a short redis-benchmark run of CALIBRATION
# requests against the primary; prints the request count that takes about STREAM_SECONDS at its
# rate (bounded either way). ARG... are more options, then the command.
sized_requests() {
  local calibration="$1" clients="$2" pipeline="$3" rate requests
  shift 3
  rate="$(timeout 60 redis-benchmark -h 127.0.0.1 -p "${PORT[0]}" -c "$clients" -P "$pipeline" \
    -n "$calibration" --csv "$@" | tail -1 | tr -d '"' | cut -d, -f2 | cut -d. -f1)"
  [[ "$rate" =~ ^[0-9]+$ ]] || rate=1000
  requests=$((rate * STREAM_SECONDS))
  ((requests < calibration)) && requests=$calibration
  ((requests > 5000000)) && requests=5000000
  echo "$requests"
}
# measured REQUESTS CLIENTS PIPELINE [ARG...] : the measured redis-benchmark run; prints its CSV
# figures "rps,avg,min,p50,p95,p99,max" (ms).
measured() {
  local requests="$1" clients="$2" pipeline="$3" csv
  shift 3
  csv="$(timeout $((STREAM_SECONDS * 6 + 60)) redis-benchmark -h 127.0.0.1 -p "${PORT[0]}" -c "$clients" \
    -P "$pipeline" -n "$requests" --csv "$@" | tail -1 | tr -d '"')"
  [[ -n "$csv" && "$csv" != test,* ]] || fail "redis-benchmark printed no result for: $*"
  echo "${csv#*,}"
}

if wants stream-publish; then
  small_aofs
  VALUE="$(head -c "$EVENT_BYTES" /dev/zero | tr '\0' e)"
  publish_case() {  # publish_case CLIENTS PIPELINE
    local clients="$1" pipeline="$2" load requests line ops p50 p99 max stored drain caught
    note "XADD ${EVENT_BYTES} B to one stream, $clients clients, $pipeline XADD(s) per round trip"
    load=(XADD peers:events '*' b "$VALUE")
    requests="$(sized_requests $((pipeline > 1 ? clients * pipeline * 20 : 5000)) "$clients" "$pipeline" "${load[@]}")"
    cli "${PORT[0]}" del peers:events >/dev/null  # the calibration's entries
    line="$(measured "$requests" "$clients" "$pipeline" "${load[@]}")"
    IFS=, read -r ops _ _ p50 _ p99 max <<<"$line"
    stored="$(cli "${PORT[0]}" xlen peers:events)"
    drain="$("${PROBE[@]}" drained --primary "${PORT[0]}" --replicas "${PORT[1]},${PORT[2]}")"
    caught="$(field "$drain" seconds)"
    [[ "$(field "$drain" drained)" == yes ]] || caught="$caught (not caught up)"
    echo "  kind=redis-xadd clients=$clients per_round_trip=$pipeline events_per_s=$ops p50_ms=$p50 p99_ms=$p99 max_ms=$max requests=$requests stored=$stored caught_up_s=$(field "$drain" seconds) drained=$(field "$drain" drained)"
    PUBLISH_ROWS+=("| XADD $EVENT_BYTES B | $clients | $pipeline | $ops | $p50 | $p99 | $max | $requests | $stored | $caught |")
    cli "${PORT[0]}" del peers:events >/dev/null
  }
  for clients in $STREAM_CLIENTS; do publish_case "$clients" 1; done
  publish_case "$STREAM_BATCH_CLIENTS" "$STREAM_BATCH"
fi

if wants stream-lag; then
  poll 120 both_online || fail "the replicas are not online before the stream-lag phase"
  small_aofs
  note "stream-lag: $DELIVERY_EVENTS XADDs at $DELIVERY_RATE/s, XREAD BLOCK on both replicas"
  DELIVERY_LINE="$("${PROBE[@]}" delivery --primary "${PORT[0]}" --replicas "${PORT[1]},${PORT[2]}" \
    --events "$DELIVERY_EVENTS" --rate "$DELIVERY_RATE" --bytes "$EVENT_BYTES" --max-seconds 90)"
  echo "  $DELIVERY_LINE"
  cli "${PORT[0]}" del peers:delivery >/dev/null
fi

if wants stream-read; then
  note "stream-read: $READ_EVENTS entries of $EVENT_BYTES B, then XRANGE COUNT $READ_PAGE, $READ_CLIENTS clients"
  fill="$("${PROBE[@]}" fill --port "${PORT[0]}" --key peers:read --sequential-ids --records "$READ_EVENTS" \
    --bytes "$EVENT_BYTES" --batch 1000)"
  echo "  $fill"
  [[ "$(field "$fill" length)" == "$READ_EVENTS" ]] || fail "the read stream holds $(field "$fill" length) entries, not $READ_EVENTS"
  # -r: the page starts at a random id in 0 .. READ_EVENTS - READ_PAGE, so every page is full.
  load=(-r $((READ_EVENTS - READ_PAGE + 1)) XRANGE peers:read __rand_int__ + COUNT "$READ_PAGE")
  requests="$(sized_requests 500 "$READ_CLIENTS" 1 "${load[@]}")"
  line="$(measured "$requests" "$READ_CLIENTS" 1 "${load[@]}")"
  IFS=, read -r pages _ _ p50 _ p99 max <<<"$line"
  events="$(awk -v p="$pages" -v n="$READ_PAGE" 'BEGIN {printf "%.0f", p * n}')"
  echo "  kind=redis-xrange clients=$READ_CLIENTS page=$READ_PAGE pages_per_s=$pages events_per_s=$events p50_ms=$p50 p99_ms=$p99 max_ms=$max pages=$requests stream_length=$READ_EVENTS"
  READ_ROWS+=("| XRANGE COUNT $READ_PAGE, primary | $READ_CLIENTS | $pages | $events | $p50 | $p99 | $max | $requests | $READ_EVENTS x $EVENT_BYTES B |")
  cli "${PORT[0]}" del peers:read >/dev/null
fi

if wants_any bench lag "${STREAM_PHASES[@]}"; then
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

if wants queue; then
  # A fresh cluster (its AOFs small), so that the phase can run alone or after the others.
  note "queue: a stream with one consumer group on the primary; primary on ${PORT[0]}, replicas on ${PORT[1]} and ${PORT[2]}"
  cluster_up queue
  for pairs in $QUEUE_PAIRS; do
    note "queue: $pairs pair(s) of XADD -> XREADGROUP COUNT 1 BLOCK -> XACK, about $QUEUE_SECONDS s"
    line="$(timeout $((QUEUE_SECONDS + 60)) "${PROBE[@]}" queue --primary "${PORT[0]}" --pairs "$pairs" \
      --seconds "$QUEUE_SECONDS" --bytes "$EVENT_BYTES")"
    echo "  $line"
    QUEUE_ROWS+=("| Redis Streams, consumer group | $pairs | $(field "$line" msgs_per_s) | $(field "$line" p50_ms) | $(field "$line" p99_ms) | $(field "$line" max_ms) | $(field "$line" round_trips) | $(field "$line" errors) | $(field "$line" pending) / $(field "$line" undelivered) |")
  done
  note "queue: $QUEUE_SAMPLES sends to a receiver parked in XREADGROUP BLOCK"
  QUEUE_LATENCY_LINE="$(timeout 100 "${PROBE[@]}" queue-latency --primary "${PORT[0]}" --samples "$QUEUE_SAMPLES" \
    --gap-ms "$QUEUE_GAP_MS" --bytes "$EVENT_BYTES" --max-seconds 40)"
  echo "  $QUEUE_LATENCY_LINE"
  note "queue: XADD $QUEUE_MESSAGES, then one consumer drains them, $QUEUE_BATCH per XREADGROUP + XACK"
  QUEUE_DRAIN_LINE="$(timeout 100 "${PROBE[@]}" queue-drain --primary "${PORT[0]}" --messages "$QUEUE_MESSAGES" \
    --batch "$QUEUE_BATCH" --bytes "$EVENT_BYTES" --max-seconds 60)"
  echo "  $QUEUE_DRAIN_LINE"
  echo "  full resyncs seen by the replicas: $(resyncs queue)"
  cluster_down
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
if wants stream-publish; then
  echo "| stream publish (XADD to one stream on the primary) | clients | XADDs per round trip | events/s | p50 ms | p99 ms | max ms | requests | entries stored | replicas caught up after, s |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${PUBLISH_ROWS[@]}"
  echo
fi
if wants stream-lag; then
  echo "| stream delivery (XADD reply on the primary -> XREAD BLOCK reply on the replicas), $(field "$DELIVERY_LINE" rate_per_s) XADDs/s | figure |"
  echo "|---|---|"
  echo "| events (not seen on every replica) | $(field "$DELIVERY_LINE" events) ($(field "$DELIVERY_LINE" missed)) |"
  echo "| on every replica p50 / p99 / max ms | $(field "$DELIVERY_LINE" all_p50_ms) / $(field "$DELIVERY_LINE" all_p99_ms) / $(field "$DELIVERY_LINE" all_max_ms) |"
  echo "| on replica 1 p50 / p99 ms | $(field "$DELIVERY_LINE" replica1_p50_ms) / $(field "$DELIVERY_LINE" replica1_p99_ms) |"
  echo "| XADD round trip p50 / p99 ms | $(field "$DELIVERY_LINE" xadd_p50_ms) / $(field "$DELIVERY_LINE" xadd_p99_ms) |"
  echo "| read before the publisher took the ack's time (counted as 0) | $(field "$DELIVERY_LINE" seen_before_ack) |"
  echo
fi
if wants stream-read; then
  echo "| stream read (XRANGE from a random id) | clients | pages/s | events/s | p50 ms | p99 ms | max ms | pages | stream |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${READ_ROWS[@]}"
  echo
fi
if wants catchup; then
  echo "| catch-up mode | repl-backlog-size | records missed | write rate rec/s | link up after s | caught up after s | caught up | resync |"
  echo "|---|---|---|---:|---:|---:|---|---|"
  printf '%s\n' "${CATCHUP_ROWS[@]}"
fi
if wants queue; then
  wants catchup && echo
  echo "| queue | pairs | msgs/s (round trips) | round trip p50 ms | p99 ms | max ms | round trips | errors | left: pending / undelivered |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${QUEUE_ROWS[@]}"
  echo
  echo "| queue latency (XADD sent -> XREADGROUP reply of a parked receiver) | samples | p50 ms | p99 ms | max ms | lost |"
  echo "|---|---:|---:|---:|---:|---:|"
  echo "| Redis Streams, consumer group | $(field "$QUEUE_LATENCY_LINE" samples) | $(field "$QUEUE_LATENCY_LINE" p50_ms) | $(field "$QUEUE_LATENCY_LINE" p99_ms) | $(field "$QUEUE_LATENCY_LINE" max_ms) | $(field "$QUEUE_LATENCY_LINE" lost) |"
  echo
  echo "| queue drain (one consumer) | messages | drained | seconds | msgs/s | batch | left: pending / undelivered |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  echo "| Redis Streams, XREADGROUP COUNT $QUEUE_BATCH + XACK | $(field "$QUEUE_DRAIN_LINE" messages) | $(field "$QUEUE_DRAIN_LINE" drained) | $(field "$QUEUE_DRAIN_LINE" seconds) | $(field "$QUEUE_DRAIN_LINE" msgs_per_s) | $(field "$QUEUE_DRAIN_LINE" batch) | $(field "$QUEUE_DRAIN_LINE" pending) / $(field "$QUEUE_DRAIN_LINE" undelivered) |"
fi
