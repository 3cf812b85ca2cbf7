#!/usr/bin/env bash
# PostgreSQL 15: a primary and one streaming replica (pg_basebackup, physical replication slot)
# on 127.0.0.1, fsync=on and synchronous_commit=on.
#   async: synchronous_standby_names = '' -> COMMIT returns once the primary fsynced its WAL;
#          the replica follows on its own.
#   sync:  synchronous_standby_names = 'standby1' -> COMMIT also waits until the replica has
#          written and flushed the WAL to its disk (remote flush; not yet replayed/visible).
# pgbench runs one ~100-byte INSERT per transaction with 1, 16 and 50 clients in each mode while
# pg_stat_replication is sampled for the replica's lag. Then the catch-up: the replica is stopped,
# CATCHUP_TXNS transactions commit, it restarts; time until it replayed up to the primary's LSN.
#   bash bench/peers/postgres/run.sh            (about 2.5 min)
# Env: PG_SECONDS (per pgbench run, 10), CLIENT_COUNTS ("1 16 50"), STANDBY_MODES ("async sync"),
#      CATCHUP_TXNS (100000), PG_BIN (/usr/lib/postgresql/<newest>/bin), PORT_BASE (15501)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require_venv
require runuser
PG_BIN="${PG_BIN:-/usr/lib/postgresql/$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)/bin}"
[[ -x "$PG_BIN/postgres" && -x "$PG_BIN/pgbench" ]] || fail "no postgres/pgbench in $PG_BIN; run bash $PEERS_ROOT/setup.sh"
PG_SECONDS="${PG_SECONDS:-10}"
CLIENT_COUNTS="${CLIENT_COUNTS:-1 16 50}"
STANDBY_MODES="${STANDBY_MODES:-async sync}"
CATCHUP_TXNS="${CATCHUP_TXNS:-100000}"
STATS=("$PEERS_PY" "$PEERS_ROOT/postgres/pgstats.py")

new_scratch postgres
chown postgres: "$SCRATCH"
machine
"$PG_BIN/postgres" --version
free_ports PRIMARY_PORT "${PORT_BASE:-15501}" 2
STANDBY_PORT=$((PRIMARY_PORT + 1))
PRIMARY="$SCRATCH/primary"
STANDBY="$SCRATCH/standby"
sql() {  # sql PORT STATEMENT : one statement, unaligned output
  local port="$1"; shift
  timeout 60 "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 -p "$port" -U postgres -d postgres -c "$*"
}
declare -A SERVER_PID=()
server_up() {  # server_up DATADIR PORT : pg_ctl starts it; its postmaster PID is remembered
  as_postgres "$PG_BIN/pg_ctl" -D "$1" -o "-p $2" -l "$1.log" -w -t 90 start >/dev/null ||
    fail "postgres did not start on $2 (see $1.log)"
  SERVER_PID[$1]="$(head -1 "$1/postmaster.pid")"
  own "${SERVER_PID[$1]}" INT  # SIGINT: fast shutdown
}
server_down() { halt "${SERVER_PID[$1]}" 60 INT; }

note "initdb: primary on 127.0.0.1:$PRIMARY_PORT"
pg_initdb "$PRIMARY"
cat >>"$PRIMARY/postgresql.conf" <<CONF
wal_level = replica
max_wal_senders = 4
max_replication_slots = 4
hot_standby = on
max_connections = 120
shared_buffers = 256MB
synchronous_standby_names = ''
CONF
server_up "$PRIMARY" "$PRIMARY_PORT"
sql "$PRIMARY_PORT" "CREATE TABLE records (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), body text NOT NULL)"

note "pg_basebackup: standby on 127.0.0.1:$STANDBY_PORT (slot standby1_slot)"
as_postgres "$PG_BIN/pg_basebackup" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -D "$STANDBY" -R -X stream \
  -C -S standby1_slot --checkpoint=fast >"$SCRATCH/basebackup.log" 2>&1 || fail "pg_basebackup failed"
cat >>"$STANDBY/postgresql.auto.conf" <<CONF
primary_conninfo = 'host=127.0.0.1 port=$PRIMARY_PORT user=postgres application_name=standby1'
primary_slot_name = 'standby1_slot'
CONF
server_up "$STANDBY" "$STANDBY_PORT"
standby_state() { sql "$PRIMARY_PORT" "SELECT state || ':' || sync_state FROM pg_stat_replication WHERE application_name = 'standby1'"; }
streaming() { [[ "$(standby_state)" == streaming:* ]]; }
poll 60 streaming || fail "the standby is not streaming"

printf '%s\n' "INSERT INTO records (body) VALUES (rpad(:client_id || ':' || random()::text, 100, '.'));" >"$SCRATCH/insert.sql"
chmod 644 "$SCRATCH/insert.sql"

sample_lag() {  # sample_lag FILE SECONDS : pg_stat_replication twice a second, after a 2 s ramp-up
  sleep 2
  local until=$((SECONDS + $2))
  while ((SECONDS < until)); do
    timeout 5 "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -d postgres -c \
      "SELECT coalesce((extract(epoch FROM replay_lag) * 1000)::text, ''), coalesce((extract(epoch FROM flush_lag) * 1000)::text, ''),
              coalesce((extract(epoch FROM write_lag) * 1000)::text, ''), pg_wal_lsn_diff(pg_current_wal_lsn(), replay_lsn)
       FROM pg_stat_replication WHERE application_name = 'standby1'" >>"$1" 2>/dev/null || true
    sleep 0.5
  done
}

declare -a ROWS=()
measure() {  # measure MODE CLIENTS
  local mode="$1" clients="$2" threads=2 prefix sampler out tps lat lag
  ((clients == 1)) && threads=1
  prefix="$SCRATCH/txlog-$mode-$clients"
  sample_lag "$prefix.lag" $((PG_SECONDS - 2)) &
  sampler=$!
  own "$sampler"
  out="$(cd "$SCRATCH" && timeout $((PG_SECONDS + 90)) "$PG_BIN/pgbench" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres \
    -n -M prepared -f "$SCRATCH/insert.sql" -c "$clients" -j "$threads" -T "$PG_SECONDS" -l --log-prefix="$prefix" postgres 2>&1)" ||
    fail "pgbench failed: $(tail -1 <<<"$out")"
  halt "$sampler" 5
  tps="$(awk '$1 == "tps" {printf "%.0f", $3; exit}' <<<"$out")"
  lat="$("${STATS[@]}" latency "$prefix".[0-9]*)"
  lag="$("${STATS[@]}" lag "$prefix.lag")"
  echo "  $mode clients=$clients tps=$tps $lat"
  echo "  $lag"
  ROWS+=("| $mode | $clients | $tps | $(field "$lat" p50_ms) | $(field "$lat" p99_ms) | $(field "$lat" max_ms) | $(field "$lag" replay_p50_ms) / $(field "$lag" replay_p99_ms) / $(field "$lag" replay_max_ms) | $(field "$lag" flush_p50_ms) / $(field "$lag" flush_p99_ms) | $(field "$lag" bytes_behind_max) | $(field "$lag" replay_n) |")
  rm -f "$prefix".[0-9]*
}
standby_names() {
  sql "$PRIMARY_PORT" "ALTER SYSTEM SET synchronous_standby_names = '$1'" >/dev/null
  sql "$PRIMARY_PORT" "SELECT pg_reload_conf()" >/dev/null
}
for mode in $STANDBY_MODES; do
  case "$mode" in
    async) standby_names "" ;;
    sync)
      standby_names standby1
      is_sync() { [[ "$(standby_state)" == streaming:sync ]]; }
      poll 30 is_sync || fail "the standby did not become synchronous"
      ;;
    *) fail "unknown mode $mode (async or sync)" ;;
  esac
  note "mode $mode: standby is $(standby_state)"
  for clients in $CLIENT_COUNTS; do
    note "pgbench: $mode, $clients client(s), ${PG_SECONDS}s"
    measure "$mode" "$clients"
  done
done

standby_names ""
note "catch-up: standby stopped while $CATCHUP_TXNS single-row transactions commit"
server_down "$STANDBY"
fill="$(cd "$SCRATCH" && timeout 600 "$PG_BIN/pgbench" -h 127.0.0.1 -p "$PRIMARY_PORT" -U postgres -n -M prepared \
  -f "$SCRATCH/insert.sql" -c 10 -j 2 -t $((CATCHUP_TXNS / 10)) postgres 2>&1)" || fail "pgbench (catch-up fill) failed"
fill_tps="$(awk '$1 == "tps" {printf "%.0f", $3; exit}' <<<"$fill")"
target="$(sql "$PRIMARY_PORT" "SELECT pg_current_wal_lsn()")"
missed="$(sql "$PRIMARY_PORT" "SELECT pg_size_pretty(pg_wal_lsn_diff(pg_current_wal_lsn(), restart_lsn)) FROM pg_replication_slots WHERE slot_name = 'standby1_slot'")"
note "primary at $target; the slot holds $missed of WAL for the standby; restarting it"
began="$(date +%s.%N)"
server_up "$STANDBY" "$STANDBY_PORT"
ready="$(date +%s.%N)"
replayed() { [[ "$(sql "$STANDBY_PORT" "SELECT pg_last_wal_replay_lsn() >= '$target'::pg_lsn")" == t ]]; }
if poll 300 replayed; then caught=yes; else caught=no; fi
done_at="$(date +%s.%N)"
ready_s="$(awk -v a="$began" -v b="$ready" 'BEGIN {printf "%.2f", b - a}')"
caught_s="$(awk -v a="$began" -v b="$done_at" 'BEGIN {printf "%.2f", b - a}')"
echo "  caught up: $caught after ${caught_s}s (accepting connections after ${ready_s}s)"

echo
echo "== postgres $("$PG_BIN/postgres" --version | awk '{print $3}'): one primary and one streaming standby; fsync=on, synchronous_commit=on, full_page_writes=on ($(date -u +%FT%TZ)) =="
echo "| replica mode | clients | commits/s (one row each) | p50 ms | p99 ms | max ms | standby replay_lag p50 / p99 / max ms | standby flush_lag p50 / p99 ms | replay behind, most bytes | lag samples |"
echo "|---|---:|---:|---:|---:|---:|---|---|---:|---:|"
printf '%s\n' "${ROWS[@]}"
echo
echo "| catch-up | figure |"
echo "|---|---|"
echo "| transactions committed while the standby was down | $CATCHUP_TXNS (10 pgbench clients, $fill_tps tps) |"
echo "| WAL kept for it by its slot | $missed |"
echo "| restart -> accepting connections | $ready_s s |"
echo "| restart -> replayed to the primary's LSN | $caught_s s (caught up: $caught) |"
echo "| how | streamed from the primary's replication slot (no new base backup) |"
