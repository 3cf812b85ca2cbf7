#!/usr/bin/env bash
# etcd 3.4: three members on 127.0.0.1 with their default, durable settings. A Put is
# acknowledged once raft committed it, i.e. the leader and at least one follower fsynced the
# entry to their WAL (quorum 2 of 3, synchronous), and the leader applied it.
# Load: etcd/putload.py (gRPC), N writers each with one Put at a time, ~100-byte values over a
# 100k key space, against the leader's endpoint (and once spread over all three members).
#   bash bench/peers/etcd/run.sh            (about 1.5 min)
# Env: ETCD_SECONDS (per configuration, 8), PORT_BASE (12501)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require etcd etcdctl
require_venv
ETCD_SECONDS="${ETCD_SECONDS:-8}"
LOAD=("$PEERS_PY" "$PEERS_ROOT/etcd/putload.py")

new_scratch etcd
machine
etcd --version | head -1
free_ports CLIENT "${PORT_BASE:-12501}" 3
free_ports PEER $((CLIENT + 100)) 3
MEMBERS="m1=http://127.0.0.1:$PEER,m2=http://127.0.0.1:$((PEER + 1)),m3=http://127.0.0.1:$((PEER + 2))"
ENDPOINTS="127.0.0.1:$CLIENT,127.0.0.1:$((CLIENT + 1)),127.0.0.1:$((CLIENT + 2))"
TOKEN="peers-$$-$RANDOM"  # one token for all three: members of one cluster
for n in 1 2 3; do
  etcd --name "m$n" --data-dir "$SCRATCH/m$n" \
    --listen-client-urls "http://127.0.0.1:$((CLIENT + n - 1))" --advertise-client-urls "http://127.0.0.1:$((CLIENT + n - 1))" \
    --listen-peer-urls "http://127.0.0.1:$((PEER + n - 1))" --initial-advertise-peer-urls "http://127.0.0.1:$((PEER + n - 1))" \
    --initial-cluster "$MEMBERS" --initial-cluster-state new --initial-cluster-token "$TOKEN" \
    --logger zap --log-outputs "$SCRATCH/m$n.log" >"$SCRATCH/m$n.out" 2>&1 &
  own $!
done
healthy() { ETCDCTL_API=3 timeout 20 etcdctl --endpoints="$ENDPOINTS" endpoint health; }
poll 60 healthy || fail "the etcd members are not healthy"
LEADER="$(field "$(timeout 30 "${LOAD[@]}" leader --endpoints "$ENDPOINTS")" leader)"
[[ "$LEADER" != - ]] || fail "no etcd leader"
note "3 members healthy; leader at $LEADER"

declare -a ROWS=()
configuration() {  # configuration LABEL ENDPOINTS CLIENTS CONNS VALUE_BYTES
  local line
  note "put: $1, $3 writers over $4 connection(s), $5-byte values, ${ETCD_SECONDS}s"
  line="$(timeout $((ETCD_SECONDS + 60)) "${LOAD[@]}" put --endpoints "$2" --clients "$3" --conns "$4" \
    --value-bytes "$5" --seconds "$ETCD_SECONDS")"
  echo "  $line"
  ROWS+=("| $1 | $3 | $4 | $5 | $(field "$line" ops_per_s) | $(field "$line" p50_ms) | $(field "$line" p99_ms) | $(field "$line" max_ms) | $(field "$line" errors) |")
}
configuration "leader only" "$LEADER" 1 1 100
configuration "leader only" "$LEADER" 16 4 100
configuration "leader only" "$LEADER" 50 10 100
configuration "all 3 members" "$ENDPOINTS" 50 10 100
ETCDCTL_API=3 timeout 30 etcdctl --endpoints="$ENDPOINTS" endpoint status -w table || true

echo
echo "== etcd $(etcd --version | awk '/etcd Version/ {print $3}'): 3 members on loopback, default settings (WAL fsync before the ack, quorum 2 of 3) ($(date -u +%FT%TZ)) =="
echo "| endpoints | clients | connections | value B | puts/s | p50 ms | p99 ms | max ms | errors |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
printf '%s\n' "${ROWS[@]}"
