#!/usr/bin/env bash
# NATS JetStream: three nats-server processes clustered on 127.0.0.1, a file-backed stream with
# 3 replicas (R3), ~100-byte messages published and each PubAck awaited.
# What a PubAck promises here: the message is stored by a quorum (2 of 3) of the servers. With
# nats-server 2.9 (Debian 12) "stored" means written to the file store, not fsynced: the store
# is synced on a timer, and 2.9 has no setting to sync every message (that came in 2.10), so this
# is the weakest ack of the peers.
# Rows: R3 with 1, 16, 50 publishers, one publish at a time each; 1 publisher with 256 in flight;
# 16 publishers each sending batches of 100 and awaiting all 100 PubAcks before the next; 50
# publishers with Nats-Msg-Id; and an R1 stream with 256 in flight (what replication costs).
#   bash bench/peers/nats/run.sh            (about 2 min)
# Phases (PHASES, default "publish queue"; they run in this order whatever the order in PHASES):
#   publish the rows above.
#   queue   a work queue: an R3 stream with retention=workqueue and a durable
#           pull consumer with explicit acks (jsload.py queue, queue-latency, queue-drain):
#           QUEUE_PAIRS connections each publish, fetch(1), ack_sync for about QUEUE_SECONDS;
#           QUEUE_SAMPLES publishes to a receiver parked in fetch(1) (send -> receive);
#           QUEUE_MESSAGES messages drained by one consumer, fetches of up to QUEUE_BATCH.
#   PHASES=queue bash bench/peers/nats/run.sh   (about 30 s)
# Env: NATS_SECONDS (per configuration, 8), MESSAGE_BYTES (100), PORT_BASE (14301),
#      QUEUE_PAIRS ("1 16"), QUEUE_SECONDS (8), QUEUE_SAMPLES (300), QUEUE_GAP_MS (10),
#      QUEUE_MESSAGES (10000), QUEUE_BATCH (1000)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require nats-server
require_venv
NATS_SECONDS="${NATS_SECONDS:-8}"
MESSAGE_BYTES="${MESSAGE_BYTES:-100}"
PHASES="${PHASES:-publish queue}"
QUEUE_PAIRS="${QUEUE_PAIRS:-1 16}"
QUEUE_SECONDS="${QUEUE_SECONDS:-8}"
QUEUE_SAMPLES="${QUEUE_SAMPLES:-300}"
QUEUE_GAP_MS="${QUEUE_GAP_MS:-10}"
QUEUE_MESSAGES="${QUEUE_MESSAGES:-10000}"
QUEUE_BATCH="${QUEUE_BATCH:-1000}"
wants() { [[ " $PHASES " == *" $1 "* ]]; }
LOAD=("$PEERS_PY" "$PEERS_ROOT/nats/jsload.py")

new_scratch nats
machine
nats-server --version
free_ports CLIENT "${PORT_BASE:-14301}" 3
free_ports ROUTE $((CLIENT + 100)) 3
free_ports MONITOR $((CLIENT + 200)) 3
declare -A CLIENT_PORT=()
for n in 1 2 3; do
  dir="$SCRATCH/s$n"
  mkdir -p "$dir/store"
  CLIENT_PORT[s$n]=$((CLIENT + n - 1))
  cat >"$dir/server.conf" <<CONF
server_name: s$n
host: 127.0.0.1
port: $((CLIENT + n - 1))
http: "127.0.0.1:$((MONITOR + n - 1))"
jetstream: {
  store_dir: "$dir/store"
  max_memory_store: 256MB
  max_file_store: 8GB
}
cluster: {
  name: peers
  listen: "127.0.0.1:$((ROUTE + n - 1))"
  routes: ["nats://127.0.0.1:$ROUTE", "nats://127.0.0.1:$((ROUTE + 1))", "nats://127.0.0.1:$((ROUTE + 2))"]
}
CONF
  nats-server -c "$dir/server.conf" >"$dir/server.log" 2>&1 &
  own $!
done
for n in 0 1 2; do poll 30 listening $((CLIENT + n)) || fail "nats-server s$((n + 1)) did not listen"; done
jetstream_ready() { "${LOAD[@]}" stream --url "nats://127.0.0.1:$CLIENT" --name READY --subjects "ready.>" --replicas 3; }
poll 60 jetstream_ready || fail "JetStream did not accept an R3 stream"
note "3 servers: clients on $CLIENT-$((CLIENT + 2)), routes on $ROUTE-$((ROUTE + 2))"

declare -a ROWS=()
configuration() {  # configuration REPLICAS PUBLISHERS WINDOW MSG_ID(yes|no) [BATCH]
  local replicas="$1" publishers="$2" window="$3" msg_id="$4" batch="${5:-1}" made leader url line extra=()
  made="$(timeout 60 "${LOAD[@]}" stream --url "nats://127.0.0.1:$CLIENT" --replicas "$replicas")"
  leader="$(field "$made" leader)"
  url="nats://127.0.0.1:${CLIENT_PORT[$leader]:-$CLIENT}"  # the stream leader's server: no extra hop
  [[ $msg_id == yes ]] && extra=(--msg-id)
  note "R$replicas, $publishers publisher(s) x $window lane(s) x batches of $batch, Nats-Msg-Id $msg_id, leader $leader"
  line="$(timeout $((NATS_SECONDS + 60)) "${LOAD[@]}" publish --url "$url" --publishers "$publishers" \
    --window "$window" --batch "$batch" --bytes "$MESSAGE_BYTES" --seconds "$NATS_SECONDS" "${extra[@]}")"
  echo "  $line"
  ROWS+=("| R$replicas file | $publishers | $((window * batch)) | $msg_id | $(field "$line" ops_per_s) | $(field "$line" p50_ms) | $(field "$line" p99_ms) | $(field "$line" max_ms) | $(field "$line" errors) | $batch |")
}
if wants publish; then
  configuration 3 1 1 no
  configuration 3 16 1 no
  configuration 3 50 1 no
  configuration 3 1 256 no
  configuration 3 16 1 no 100  # 16 publishers, each sending 100 at once and awaiting the 100 PubAcks
  configuration 3 50 1 yes
  configuration 1 1 256 no   # one replica: what replication costs
fi

declare -a QUEUE_ROWS=()
QUEUE_LATENCY_LINE=""
QUEUE_DRAIN_LINE=""
QUEUE_URL=""
queue_stream() {  # queue_stream : a fresh R3 work-queue stream QUEUE; QUEUE_URL := its leader's server
  local made leader
  made="$(timeout 60 "${LOAD[@]}" stream --url "nats://127.0.0.1:$CLIENT" --name QUEUE --subjects 'queue.>' \
    --replicas 3 --retention workqueue)"
  leader="$(field "$made" leader)"
  QUEUE_URL="nats://127.0.0.1:${CLIENT_PORT[$leader]:-$CLIENT}"
  note "work-queue stream QUEUE (R3), leader $leader"
}
if wants queue; then
  for pairs in $QUEUE_PAIRS; do
    queue_stream
    note "queue: $pairs pair(s) of publish -> fetch(1) -> ack_sync, about $QUEUE_SECONDS s"
    line="$(timeout $((QUEUE_SECONDS + 60)) "${LOAD[@]}" queue --url "$QUEUE_URL" --pairs "$pairs" \
      --seconds "$QUEUE_SECONDS" --bytes "$MESSAGE_BYTES")"
    echo "  $line"
    QUEUE_ROWS+=("| JetStream R3 work queue, pull consumer | $pairs | $(field "$line" msgs_per_s) | $(field "$line" p50_ms) | $(field "$line" p99_ms) | $(field "$line" max_ms) | $(field "$line" round_trips) | $(field "$line" errors) | $(field "$line" ack_pending) / $(field "$line" undelivered) |")
  done
  queue_stream
  note "queue: $QUEUE_SAMPLES publishes to a receiver parked in fetch(1)"
  QUEUE_LATENCY_LINE="$(timeout 100 "${LOAD[@]}" queue-latency --url "$QUEUE_URL" --samples "$QUEUE_SAMPLES" \
    --gap-ms "$QUEUE_GAP_MS" --bytes "$MESSAGE_BYTES" --max-seconds 40)"
  echo "  $QUEUE_LATENCY_LINE"
  queue_stream
  note "queue: publish $QUEUE_MESSAGES, then one consumer drains them, fetches of up to $QUEUE_BATCH"
  QUEUE_DRAIN_LINE="$(timeout 100 "${LOAD[@]}" queue-drain --url "$QUEUE_URL" --messages "$QUEUE_MESSAGES" \
    --batch "$QUEUE_BATCH" --bytes "$MESSAGE_BYTES" --max-seconds 60)"
  echo "  $QUEUE_DRAIN_LINE"
fi

echo
echo "== nats-server $(nats-server --version | grep -o '[0-9][0-9.]*$') JetStream: 3 servers, file storage, ${MESSAGE_BYTES} B messages, PubAck = stored (not fsynced) on a quorum ($(date -u +%FT%TZ)) =="
if wants publish; then
  echo "| stream | publishers | in flight each | msg id | PubAcks/s | p50 ms | p99 ms | max ms | errors | batch (awaited together; latency per batch) |"
  echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
  printf '%s\n' "${ROWS[@]}"
fi
if wants queue; then
  wants publish && echo
  echo "| queue | pairs | msgs/s (round trips) | round trip p50 ms | p99 ms | max ms | round trips | errors | left: pending / undelivered |"
  echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
  printf '%s\n' "${QUEUE_ROWS[@]}"
  echo
  echo "| queue latency (publish sent -> fetch(1) of a parked receiver returns) | samples | p50 ms | p99 ms | max ms | lost |"
  echo "|---|---:|---:|---:|---:|---:|"
  echo "| JetStream R3 work queue, pull consumer | $(field "$QUEUE_LATENCY_LINE" samples) | $(field "$QUEUE_LATENCY_LINE" p50_ms) | $(field "$QUEUE_LATENCY_LINE" p99_ms) | $(field "$QUEUE_LATENCY_LINE" max_ms) | $(field "$QUEUE_LATENCY_LINE" lost) |"
  echo
  echo "| queue drain (one consumer) | messages | drained | seconds | msgs/s | batch | left: pending / undelivered |"
  echo "|---|---:|---:|---:|---:|---:|---|"
  echo "| JetStream R3 work queue, fetch($QUEUE_BATCH) + ack each | $(field "$QUEUE_DRAIN_LINE" messages) | $(field "$QUEUE_DRAIN_LINE" drained) | $(field "$QUEUE_DRAIN_LINE" seconds) | $(field "$QUEUE_DRAIN_LINE" msgs_per_s) | $(field "$QUEUE_DRAIN_LINE" batch) | $(field "$QUEUE_DRAIN_LINE" ack_pending) / $(field "$QUEUE_DRAIN_LINE" undelivered) |"
fi
