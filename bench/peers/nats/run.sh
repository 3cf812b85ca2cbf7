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
#   bash bench/peers/nats/run.sh            (about 1.5 min)
# Env: NATS_SECONDS (per configuration, 8), MESSAGE_BYTES (100), PORT_BASE (14301)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require nats-server
require_venv
NATS_SECONDS="${NATS_SECONDS:-8}"
MESSAGE_BYTES="${MESSAGE_BYTES:-100}"
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
configuration 3 1 1 no
configuration 3 16 1 no
configuration 3 50 1 no
configuration 3 1 256 no
configuration 3 16 1 no 100  # 16 publishers, each sending 100 at once and awaiting the 100 PubAcks
configuration 3 50 1 yes
configuration 1 1 256 no   # one replica: what replication costs

echo
echo "== nats-server $(nats-server --version | grep -o '[0-9][0-9.]*$') JetStream: 3 servers, file storage, ${MESSAGE_BYTES} B messages, PubAck = stored (not fsynced) on a quorum ($(date -u +%FT%TZ)) =="
echo "| stream | publishers | in flight each | msg id | PubAcks/s | p50 ms | p99 ms | max ms | errors | batch (awaited together; latency per batch) |"
echo "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
