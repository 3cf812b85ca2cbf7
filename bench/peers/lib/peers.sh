# Bash helpers shared by the peer scripts; each <peer>/run.sh sources this file.
#
# What every peer script promises:
#   - servers listen on 127.0.0.1 only, on ports found free at start (never the default ports);
#   - each run gets its own scratch folder under $TMPDIR (deleted on exit; KEEP_SCRATCH=1 keeps it);
#   - every process a script starts is remembered by PID and stopped by that PID on exit;
#   - every load loop has both a count bound and a time bound.
# Progress goes to stderr; figures and the final tables go to stdout.

set -euo pipefail

PEERS_ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
PEERS_PY="$PEERS_ROOT/.venv/bin/python"
SCRATCH=""
declare -a OWNED_PIDS=()

note() { printf '%s %s\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
fail() { note "FAILED: $*"; exit 1; }

# require CMD... : every command must be on PATH (setup.sh installs them).
require() {
  local c
  for c in "$@"; do
    command -v "$c" >/dev/null 2>&1 || fail "'$c' is not installed; run bash $PEERS_ROOT/setup.sh"
  done
}
require_venv() { [[ -x "$PEERS_PY" ]] || fail "no venv at $PEERS_ROOT/.venv; run bash $PEERS_ROOT/setup.sh"; }

new_scratch() {  # new_scratch NAME : a fresh folder in $SCRATCH
  SCRATCH="$(mktemp -d "${TMPDIR:-/tmp}/tidal-peer-$1.XXXXXX")"
  chmod 755 "$SCRATCH"
}

own() { OWNED_PIDS+=("$1:${2:-TERM}"); }  # own PID [SIGNAL] : stop it at exit with SIGNAL

# halt PID [GRACE_SECONDS] [SIGNAL] : send SIGNAL (default TERM), wait up to GRACE, then SIGKILL.
halt() {
  local pid="$1" grace="${2:-15}" sig="${3:-TERM}" waited=0
  if ! kill -0 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    disown_pid "$pid"
    return 0
  fi
  kill "-$sig" "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    # a child of this shell stays a zombie until reaped: reap it if it has exited
    if [[ "$(ps -o stat= -p "$pid" 2>/dev/null)" == Z* ]]; then break; fi
    if ((waited >= grace * 10)); then
      note "pid $pid still alive after ${grace}s: SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      break
    fi
    sleep 0.1
    waited=$((waited + 1))
  done
  wait "$pid" 2>/dev/null || true
  disown_pid "$pid"
}

# disown_pid PID : forget PID (it is gone), so that the exit cleanup cannot signal a reused PID
disown_pid() {
  local kept=() entry
  for entry in "${OWNED_PIDS[@]+"${OWNED_PIDS[@]}"}"; do
    [[ "${entry%%:*}" == "$1" ]] || kept+=("$entry")
  done
  OWNED_PIDS=("${kept[@]+"${kept[@]}"}")
}

_peers_exit() {
  local rc=$? i entry owned
  set +e
  owned=("${OWNED_PIDS[@]+"${OWNED_PIDS[@]}"}")
  for ((i = ${#owned[@]} - 1; i >= 0; i--)); do
    entry="${owned[$i]}"
    halt "${entry%%:*}" 20 "${entry##*:}"
  done
  if [[ -n "$SCRATCH" && -d "$SCRATCH" ]]; then
    if [[ "${KEEP_SCRATCH:-0}" == 1 ]]; then note "scratch kept: $SCRATCH"; else rm -rf "$SCRATCH"; fi
  fi
  exit "$rc"
}
trap _peers_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

listening() { (exec 9<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_ports VAR FIRST COUNT : VAR := the lowest port >= FIRST such that COUNT ports from it are free
free_ports() {
  local var="$1" port="$2" count="$3" k busy
  while ((port < $2 + 3000)); do
    busy=0
    for ((k = 0; k < count; k++)); do
      if listening $((port + k)); then busy=1; break; fi
    done
    if ((busy == 0)); then printf -v "$var" '%d' "$port"; return 0; fi
    port=$((port + count))
  done
  fail "no $count free ports near $2"
}

# poll SECONDS CMD... : run CMD every 0.2 s until it succeeds; non-zero if SECONDS pass first
poll() {
  local limit=$((SECONDS + $1))
  shift
  while ! "$@" >/dev/null 2>&1; do
    ((SECONDS < limit)) || return 1
    sleep 0.2
  done
}

# field LINE KEY : the value of KEY=value in a line of space-separated pairs ("-" if absent)
field() {
  local pair
  for pair in $1; do
    if [[ "$pair" == "$2="* ]]; then printf '%s' "${pair#*=}"; return 0; fi
  done
  printf '%s' "-"
}

# machine : two lines about the host, printed at the top of every peer's output
machine() {
  printf 'machine: %s, %s cores, %s MiB RAM, load %s\n' "$(uname -rm)" "$(nproc)" \
    "$(($(awk '/^MemTotal:/ {print $2}' /proc/meminfo) / 1024))" "$(cut -d' ' -f1-3 /proc/loadavg)"
  printf 'scratch filesystem: %s\n' "$(df -T "${TMPDIR:-/tmp}" | awk 'NR == 2 {print $2 " on " $1}')"
}

# PostgreSQL (the postgres peer, the pgvector peer, the crash bench): commands run as the postgres
# user, and a new cluster in a folder that listens on loopback only with the durable settings every
# comparison here uses. The caller appends its own settings to DIR/postgresql.conf.
as_postgres() { runuser -u postgres -- "$@"; }
pg_initdb() {  # pg_initdb DIR (needs PG_BIN and SCRATCH)
  as_postgres "$PG_BIN/initdb" -D "$1" -U postgres --auth=trust >"$SCRATCH/initdb.log" 2>&1 ||
    fail "initdb failed (see $SCRATCH/initdb.log with KEEP_SCRATCH=1)"
  cat >>"$1/postgresql.conf" <<CONF
# bench/peers: durable settings, loopback only
listen_addresses = '127.0.0.1'
unix_socket_directories = '$SCRATCH'
fsync = on
synchronous_commit = on
full_page_writes = on
CONF
}
