#!/usr/bin/env bash
# Crash to ready (issue 43): ingest single-record durable writes at half the measured maximum rate
# for a set time, SIGKILL a node, restart it, and time until it is ready and until it has caught up.
# Tidal (3-node local cluster, the leader killed in one trial and a follower in another), Redis 7
# (one server, appendonly yes, appendfsync always) and PostgreSQL 15 (fsync=on,
# synchronous_commit=on, full_page_writes=on) are loaded the same way in the same sitting, their
# trials alternated, CRASH_RUNS rounds; a table of medians closes the output.
#   bash bench/crash/run.sh                       (about 12 min with the defaults)
#   bash bench/crash/run.sh tidal-leader redis    (some targets, in that order within each round)
# Targets: tidal-leader tidal-follower redis postgres.
# What each trial does:
#   - starts a fresh instance (data under a scratch folder, ports found free, 127.0.0.1 only);
#   - ingests at the target's half rate for CRASH_SECONDS with CONCURRENCY clients: Tidal
#     `tidal bench --workload items --rate R` (an open-loop schedule), PostgreSQL `pgbench -R R`
#     (one 100-byte INSERT per transaction), Redis `redis-benchmark -t set -d 100` run once per
#     second for R requests (redis-benchmark cannot pace; the rate holds per second);
#   - SIGKILLs the node by its PID right after the last write was acknowledged (PostgreSQL: the
#     postmaster and its children, by their PIDs, as a crash of the whole server does);
#   - restarts it and polls every 20 ms: Tidal `GET /readyz` until 200, then its
#     tidal_applied_seqno until it reaches the leader's tidal_commit_seqno at the kill; Redis `PING`
#     until PONG (it answers LOADING while it reads its AOF); PostgreSQL `pg_isready` (it accepts
#     connections once crash recovery has replayed its WAL past the last checkpoint). For Redis
#     and PostgreSQL ready is caught up: neither serves before its log is replayed.
#   - reports what had to be replayed: Tidal's fjall journal bytes on disk at the kill and the WAL
#     bytes its startup replay folded (from the node's log: "replay done"), Redis's AOF bytes,
#     PostgreSQL's WAL bytes past the last checkpoint's redo point.
# Each target's maximum rate is probed once, at the start of the sitting, on a fresh instance
# (PROBE_SECONDS at CONCURRENCY clients), unless given (TIDAL_RATE, REDIS_RATE, PG_RATE: the half
# rates to ingest at).
# Tidal alone under another load: TIDAL_WORKLOAD=signals TIDAL_BATCH=1000 CONCURRENCY=16 (the
# fjall journal fills fastest under signal batches), e.g. to check the ready time at any rate.
# Env: TIDAL (the binary; target/release/tidal under CARGO_TARGET_DIR or the repo), CRASH_SECONDS
#      (30), CRASH_RUNS (3), CONCURRENCY (50), PROBE_SECONDS (8), PG_BIN, PORT_BASE (16501),
#      RESULTS (where the raw lines go; default target/bench-crash/crash-<UTC time>.txt).
source "$(dirname "${BASH_SOURCE[0]}")/../peers/lib/peers.sh"
REPO="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
TIDAL="${TIDAL:-${CARGO_TARGET_DIR:-$REPO/target}/release/tidal}"
CRASH_SECONDS="${CRASH_SECONDS:-30}"
CRASH_RUNS="${CRASH_RUNS:-3}"
CONCURRENCY="${CONCURRENCY:-50}"
TIDAL_WORKLOAD="${TIDAL_WORKLOAD:-items}"
TIDAL_BATCH="${TIDAL_BATCH:-1}"
PROBE_SECONDS="${PROBE_SECONDS:-8}"
PG_BIN="${PG_BIN:-/usr/lib/postgresql/$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)/bin}"
RESULTS="${RESULTS:-$REPO/target/bench-crash/crash-$(date -u +%Y%m%dT%H%M%SZ).txt}"
# How long a restarted node may take to be ready, and then to catch up, before the trial fails.
READY_LIMIT_SECONDS=120
if (($# > 0)); then TARGETS=("$@"); else TARGETS=(tidal-leader tidal-follower redis postgres); fi

[[ -x "$TIDAL" ]] || fail "no tidal binary at $TIDAL (make build, or set TIDAL)"
require curl redis-server redis-cli redis-benchmark runuser python3
[[ -x "$PG_BIN/postgres" && -x "$PG_BIN/pgbench" && -x "$PG_BIN/pg_isready" ]] || fail "no postgres in $PG_BIN"
new_scratch crash
chown postgres: "$SCRATCH"
mkdir -p "$(dirname "$RESULTS")"
: >"$RESULTS"
machine
note "results in $RESULTS; targets ${TARGETS[*]}; $CRASH_RUNS rounds of $CRASH_SECONDS s at $CONCURRENCY clients"

now_ms() { date +%s%3N; }
seconds_since() { awk -v a="$1" -v b="$(now_ms)" 'BEGIN { printf "%.3f", (b - a) / 1000 }'; }
record() { echo "$*" | tee -a "$RESULTS"; }
gone() { ! kill -0 "$1" 2>/dev/null || [[ "$(ps -o stat= -p "$1" 2>/dev/null)" == Z* ]]; }
# kill_hard PID... : SIGKILL each, then wait (bounded) until every one is gone, reaping our children.
kill_hard() {
  local pid
  for pid in "$@"; do kill -KILL "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    poll 30 gone "$pid" || fail "pid $pid still alive 30 s after SIGKILL"
    wait "$pid" 2>/dev/null || true
    disown_pid "$pid"
  done
}
# until_ok LIMIT CMD... : run CMD every 20 ms until it succeeds; non-zero after LIMIT seconds
until_ok() {
  local limit=$((SECONDS + $1))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < limit)) || return 1
    sleep 0.02
  done
}

# ---- Tidal ----------------------------------------------------------------------------------
TIDAL_DIR=""
TIDAL_BASE=0
tidal_url() { echo "http://127.0.0.1:$((TIDAL_BASE + $1 - 1))"; }
tidal_up() {
  TIDAL_DIR="$SCRATCH/tidal"
  rm -rf "$TIDAL_DIR"
  free_ports TIDAL_BASE "${PORT_BASE:-16501}" 3
  "$TIDAL" cluster up --dir "$TIDAL_DIR" --port-base "$TIDAL_BASE" >"$SCRATCH/tidal-up.log" 2>&1 ||
    fail "tidal cluster up failed: $(tail -5 "$SCRATCH/tidal-up.log")"
  local id
  for id in 1 2 3; do own "$(cat "$TIDAL_DIR/n$id.pid")"; done
}
tidal_down() {
  local id pid
  for id in 1 2 3; do
    pid="$(cat "$TIDAL_DIR/n$id.pid" 2>/dev/null || true)"
    [[ -n "$pid" ]] && halt "$pid" 30
  done
  rm -rf "$TIDAL_DIR"
}
ports_free() { ! listening $((TIDAL_BASE + $1 - 1)) && ! listening $((TIDAL_BASE + 100 + $1 - 1)); }
tidal_role() { curl -s --max-time 2 "$(tidal_url "$1")/readyz"; }
tidal_leader() {
  local id
  for id in 1 2 3; do
    if [[ "$(tidal_role "$id")" == *leader* ]]; then echo "$id"; return 0; fi
  done
  return 1
}
tidal_metric() { curl -s --max-time 2 "$(tidal_url "$1")/metrics" | awk -v m="$2" '$1 == m { printf "%d", $2 }'; }
tidal_ready() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$(tidal_url "$1")/readyz")" == 200 ]]; }
tidal_caught_up() { local a; a="$(tidal_metric "$1" tidal_applied_seqno)"; [[ -n "$a" ]] && ((a >= $2)); }
tidal_bench() {  # tidal_bench URL SECONDS RATE : prints the bench's summary row
  "$TIDAL" bench --url "$1" --workload "$TIDAL_WORKLOAD" --batch "$TIDAL_BATCH" --concurrency "$CONCURRENCY" \
    --seconds "$2" --rate "$3" 2>/dev/null | grep -i "^| $TIDAL_WORKLOAD"
}
tidal_up_http() { [[ "$(curl -s -o /dev/null -w '%{http_code}' --max-time 1 "$(tidal_url "$1")/healthz")" == 200 ]]; }
tidal_probe() {
  tidal_up
  local leader row
  leader="$(tidal_leader)" || fail "no Tidal leader"
  row="$(tidal_bench "$(tidal_url "$leader")" "$PROBE_SECONDS" 0)"
  tidal_down
  record "probe target=tidal row=\"$row\"" >&2
  echo "$row" | awk -F'|' '{ printf "%d", $8 / 2 }'
}
# tidal_trial ROLE RUN : ROLE is leader or follower
tidal_trial() {
  local role="$1" run="$2" leader victim pid commit row journal t0 serving ready caught log_from replay
  tidal_up
  leader="$(tidal_leader)" || fail "no Tidal leader"
  row="$(tidal_bench "$(tidal_url "$leader")" "$CRASH_SECONDS" "$TIDAL_RATE")"
  if [[ "$role" == leader ]]; then victim="$leader"; else victim=$((leader % 3 + 1)); fi
  commit="$(tidal_metric "$leader" tidal_commit_seqno)"
  pid="$(cat "$TIDAL_DIR/n$victim.pid")"
  local killed_at teardown
  killed_at="$(now_ms)"
  kill_hard "$pid"
  # A killed process whose other threads are still in the kernel (a long fsync) keeps its sockets
  # until the last one exits, though its main thread already shows as a zombie: the restart waits
  # until the node's ports are free (seen once in three bounds-off signal trials as "Address
  # already in use"). The wait is reported, not counted in the times to ready.
  poll 60 ports_free "$victim" || fail "tidal node $victim's ports still taken 60 s after its SIGKILL"
  teardown="$(seconds_since "$killed_at")"
  # fjall's journal files are preallocated (64 MiB): count the blocks written, not the length.
  journal="$(du -B1 -c "$TIDAL_DIR/n$victim/state/"*.jnl 2>/dev/null | awk 'END { print $1 + 0 }')"
  log_from=$(($(wc -l <"$TIDAL_DIR/n$victim.log") + 1))
  # KEEP_CRASHED=DIR keeps a copy of the killed node's data dir, to open it again by hand.
  if [[ -n "${KEEP_CRASHED:-}" ]]; then rm -rf "$KEEP_CRASHED"; cp -a "$TIDAL_DIR/n$victim" "$KEEP_CRASHED"; fi
  t0="$(now_ms)"
  "$TIDAL" serve --cluster "$TIDAL_DIR/cluster.toml" --node-id "$victim" --data-dir "$TIDAL_DIR/n$victim" \
    >>"$TIDAL_DIR/n$victim.log" 2>&1 </dev/null &
  pid=$!
  echo "$pid" >"$TIDAL_DIR/n$victim.pid"
  own "$pid"
  until_ok "$READY_LIMIT_SECONDS" tidal_up_http "$victim" || {
    cp "$TIDAL_DIR/n$victim.log" "$RESULTS.n$victim.log"
    fail "tidal node $victim not serving; its log is in $RESULTS.n$victim.log"
  }
  serving="$(seconds_since "$t0")"
  until_ok "$READY_LIMIT_SECONDS" tidal_ready "$victim" || fail "tidal node $victim not ready; see $TIDAL_DIR/n$victim.log"
  ready="$(seconds_since "$t0")"
  until_ok "$READY_LIMIT_SECONDS" tidal_caught_up "$victim" "$commit" || fail "tidal node $victim did not catch up to $commit"
  caught="$(seconds_since "$t0")"
  replay="$(tail -n +"$log_from" "$TIDAL_DIR/n$victim.log" | tidal_replay_fields)"
  record "crash target=tidal-$role run=$run teardown_s=$teardown serving_s=$serving ready_s=$ready caught_up_s=$caught journal_bytes=$journal $replay commit_at_kill=$commit load=\"$row\""
  tidal_down
}
# The restarted node's log lines about its open: engine open (and its fjall and load parts) and
# WAL recovery times, the replay.
tidal_replay_fields() {
  python3 -c '
import re, sys
fields = {}
wanted = (("WAL recovered", ("engine_open_seconds", "seconds")), ("engine opened", ("fjall_seconds", "load_seconds")),
          ("replay done", ("mb", "seconds")))
for line in sys.stdin:
    line = re.sub(r"\x1b\[[0-9;]*m", "", line)
    for marker, keys in wanted:
        if marker in line:
            pairs = dict(re.findall(r"(\w+)=([0-9.e+-]+)", line))
            for key in keys:
                fields[marker + key] = pairs.get(key, "-")
print("engine_open_s=%s fjall_open_s=%s engine_load_s=%s wal_recovery_s=%s replay_mb=%s replay_s=%s" % tuple(
    fields.get(k, "0") for k in ("WAL recoveredengine_open_seconds", "engine openedfjall_seconds",
    "engine openedload_seconds", "WAL recoveredseconds", "replay donemb", "replay doneseconds")))
'
}

# ---- Redis ----------------------------------------------------------------------------------
REDIS_PORT=0
REDIS_PID=0
redis_start() {
  redis-server "$SCRATCH/redis/redis.conf" >/dev/null 2>&1 </dev/null &
  REDIS_PID=$!
  own "$REDIS_PID"
}
redis_ping() { [[ "$(redis-cli -p "$REDIS_PORT" ping 2>/dev/null)" == PONG ]]; }
redis_up() {
  rm -rf "$SCRATCH/redis"
  mkdir -p "$SCRATCH/redis"
  free_ports REDIS_PORT "${PORT_BASE:-16501}" 1
  printf '%s\n' "bind 127.0.0.1" "port $REDIS_PORT" "dir $SCRATCH/redis" "logfile $SCRATCH/redis/redis.log" \
    "daemonize no" 'save ""' "appendonly yes" "appendfsync always" >"$SCRATCH/redis/redis.conf"
  redis_start
  poll 20 redis_ping || fail "redis did not answer on $REDIS_PORT"
}
redis_down() { halt "$REDIS_PID" 20; rm -rf "$SCRATCH/redis"; }
redis_set() {  # redis_set REQUESTS : one redis-benchmark run of SETs with 100-byte values
  redis-benchmark -p "$REDIS_PORT" -t set -n "$1" -c "$CONCURRENCY" -d 100 -r 100000000 -q 2>/dev/null | tr '\r' '\n' | grep 'SET:' | tail -1
}
redis_probe() {
  redis_up
  local row
  row="$(redis_set 200000)"
  redis_down
  record "probe target=redis row=\"$row\"" >&2
  echo "$row" | awk '{ printf "%d", $2 / 2 }'
}
redis_trial() {
  local run="$1" second start aof t0 ready keys
  redis_up
  start="$(now_ms)"
  for ((second = 0; second < CRASH_SECONDS; second++)); do
    redis_set "$REDIS_RATE" >/dev/null
    # Sleep to the start of the next second of the schedule.
    local due=$((start + (second + 1) * 1000)) now
    now="$(now_ms)"
    if ((due > now)); then sleep "$(awk -v d=$((due - now)) 'BEGIN { printf "%.3f", d / 1000 }')"; fi
  done
  keys="$(redis-cli -p "$REDIS_PORT" dbsize)"
  kill_hard "$REDIS_PID"
  aof="$(du -sb "$SCRATCH/redis/appendonlydir" | awk '{ print $1 }')"
  t0="$(now_ms)"
  redis_start
  until_ok "$READY_LIMIT_SECONDS" redis_ping || fail "redis not ready after restart"
  ready="$(seconds_since "$t0")"
  record "crash target=redis run=$run ready_s=$ready caught_up_s=$ready aof_bytes=$aof keys=$keys keys_after=$(redis-cli -p "$REDIS_PORT" dbsize) seconds_of_load=$(seconds_since "$start")"
  redis_down
}

# ---- PostgreSQL -----------------------------------------------------------------------------
PG_PORT=0
PG_DATA=""
pg_sql() { timeout 60 "$PG_BIN/psql" -X -q -A -t -h 127.0.0.1 -p "$PG_PORT" -U postgres -d postgres -c "$*"; }
pg_ready() { "$PG_BIN/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"; }
pg_postmaster() { head -1 "$PG_DATA/postmaster.pid"; }
pg_up() {
  PG_DATA="$SCRATCH/pg"
  rm -rf "$PG_DATA"
  free_ports PG_PORT "${PORT_BASE:-16501}" 1
  pg_initdb "$PG_DATA"
  cat >>"$PG_DATA/postgresql.conf" <<CONF
max_connections = 120
shared_buffers = 256MB
CONF
  as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -o "-p $PG_PORT" -l "$PG_DATA.log" -w -t 90 start >/dev/null ||
    fail "postgres did not start (see $PG_DATA.log)"
  own "$(pg_postmaster)" INT
  pg_sql "CREATE TABLE records (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now(), body text NOT NULL)"
  printf '%s\n' "INSERT INTO records (body) VALUES (rpad(:client_id || ':' || random()::text, 100, '.'));" >"$SCRATCH/insert.sql"
}
pg_down() { halt "$(pg_postmaster)" 60 INT; rm -rf "$PG_DATA" "$PG_DATA.log"; }
pg_bench() {  # pg_bench SECONDS [RATE] : prints pgbench's tps line
  local rate=()
  [[ -n "${2:-}" ]] && rate=(-R "$2")
  "$PG_BIN/pgbench" -n -h 127.0.0.1 -p "$PG_PORT" -U postgres -c "$CONCURRENCY" -j 2 -T "$1" "${rate[@]}" \
    -f "$SCRATCH/insert.sql" postgres 2>/dev/null | grep '^tps' | head -1
}
pg_probe() {
  pg_up
  local row
  row="$(pg_bench "$PROBE_SECONDS")"
  pg_down
  record "probe target=postgres row=\"$row\"" >&2
  echo "$row" | awk '{ printf "%d", $3 / 2 }'
}
pg_trial() {
  local run="$1" row wal rows postmaster children t0 ready
  pg_up
  row="$(pg_bench "$CRASH_SECONDS" "$PG_RATE")"
  wal="$(pg_sql "SELECT pg_current_wal_lsn() - redo_lsn FROM pg_control_checkpoint()")"
  rows="$(pg_sql "SELECT count(*) FROM records")"
  postmaster="$(pg_postmaster)"
  children="$(ps -o pid= --ppid "$postmaster" | tr -d ' ' | tr '\n' ' ')"
  # shellcheck disable=SC2086
  kill_hard "$postmaster" $children
  # As after a crash of the machine's processes: the dead postmaster's lock files go. (Here a killed
  # postmaster can stay a zombie until something reaps it, and PostgreSQL takes a zombie's PID in
  # its socket lock file for a live postmaster.)
  rm -f "$PG_DATA/postmaster.pid" "$SCRATCH/.s.PGSQL.$PG_PORT.lock"
  t0="$(now_ms)"
  as_postgres "$PG_BIN/pg_ctl" -D "$PG_DATA" -o "-p $PG_PORT" -l "$PG_DATA.log" -W start >/dev/null ||
    fail "pg_ctl start failed"
  until_ok "$READY_LIMIT_SECONDS" pg_ready || fail "postgres not ready after restart (see $PG_DATA.log)"
  ready="$(seconds_since "$t0")"
  own "$(pg_postmaster)" INT
  record "crash target=postgres run=$run ready_s=$ready caught_up_s=$ready wal_past_checkpoint_bytes=$wal rows=$rows rows_after=$(pg_sql "SELECT count(*) FROM records") load=\"$row\""
  pg_down
}

# ---- the sitting ----------------------------------------------------------------------------
wants() { [[ " ${TARGETS[*]} " == *" $1"* ]]; }
if wants tidal; then TIDAL_RATE="${TIDAL_RATE:-$(tidal_probe)}"; note "tidal half rate $TIDAL_RATE/s"; fi
if wants redis; then REDIS_RATE="${REDIS_RATE:-$(redis_probe)}"; note "redis half rate $REDIS_RATE/s"; fi
if wants postgres; then PG_RATE="${PG_RATE:-$(pg_probe)}"; note "postgres half rate $PG_RATE/s"; fi
record "rates tidal=${TIDAL_RATE:--} redis=${REDIS_RATE:--} postgres=${PG_RATE:--} seconds=$CRASH_SECONDS concurrency=$CONCURRENCY"
for ((run = 1; run <= CRASH_RUNS; run++)); do
  for target in "${TARGETS[@]}"; do
    note "round $run: $target"
    case "$target" in
      tidal-leader) tidal_trial leader "$run" ;;
      tidal-follower) tidal_trial follower "$run" ;;
      redis) redis_trial "$run" ;;
      postgres) pg_trial "$run" ;;
      *) fail "unknown target $target" ;;
    esac
    sleep 2 # a breath between trials for writeback
  done
done
echo "== crash to ready: medians of $CRASH_RUNS runs, $CRASH_SECONDS s at half the max rate, $CONCURRENCY clients ($(date -u +%FT%TZ)) =="
python3 "$REPO/bench/crash/report.py" "$RESULTS"
