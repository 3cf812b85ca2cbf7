#!/usr/bin/env bash
# The approximate feed index's pgvector peer (decisions/067): one PostgreSQL 15 server with
# pgvector's HNSW index (by default m = 16, ef_construction = 64, pgvector's) over the SAME clustered
# embeddings as hnsw_peer.py, used as a user would: over TCP on 127.0.0.1, prepared statements, one
# connection per client. pgvector_peer.py loads ITEMS rows with a binary COPY, builds the index
# (in memory: maintenance_work_mem 3GB, 1 parallel worker + the leader) and measures similar-item
# queries (top 20 by cosine, the item itself excluded): recall@20 and latency for each
# hnsw.ef_search at 1 client, throughput at CLIENTS clients, the query with the 1,000 nearest
# items excluded (without and with iterative index scans), and the exact scan.
#   bash bench/peers/ann/pgvector.sh                        ITEMS=1000000 DIM=128 by default
#   PEER_TIMEOUT=3600 bash bench/peers/run-all.sh pgvector    (pgvector/run.sh runs this script)
# At 1M x 128 on 2 cores the index build alone takes minutes (more beside other work), and the
# whole run more than run-all's default PEER_TIMEOUT of 600 s: raise PEER_TIMEOUT (the script's
# own bound on load + build + queries, PGVECTOR_SECONDS, follows it). Like ann/run.sh it is not in
# run-all.sh's default list; run it by name.
# Debian 12 has no pgvector package: it is built from source and installed into PostgreSQL's lib
# folder (root); later runs reuse the installed one while its version is the one wanted
# (PGVECTOR_REBUILD=1 builds again). The source is PGVECTOR_SRC (a folder with pgvector's source)
# or else pgvector's v$PGVECTOR_VERSION release tarball from GitHub, fetched with curl. Installs
# what is missing: postgresql-server-dev-<major> (apt-get, as setup.sh does; on Debian it also
# brings clang and may update the postgresql-<major> package to its newest minor) and psycopg +
# numpy in the venv.
# Env: ITEMS (1000000), DIM (128), QUERIES (200), CLIENTS (16), HNSW_M (16), EF_CONSTRUCTION
#      (64; hnsw_peer.py builds with 100), EF_SEARCH ("40 64 128 256": the 1-client sweep; 40 is
#      pgvector's default), CONC_EF ("40 128": the CLIENTS-client runs; "" for none), CONC_SECONDS
#      (15, each CLIENTS-client run), EXACT_QUERIES (3), PGVECTOR_SECONDS (the driver's bound:
#      PEER_TIMEOUT - 90 s if PEER_TIMEOUT is set, else 3300), SHARED_BUFFERS (3GB),
#      MAINTENANCE_WORK_MEM (3GB), PGVECTOR_VERSION (0.8.6: the newest 0.8.x; 0.6.0-0.8.1 have
#      a buffer overflow in parallel HNSW builds, pgvector issue 959, fixed in 0.8.2), PGVECTOR_SRC, PGVECTOR_REBUILD, PG_BIN
#      (/usr/lib/postgresql/<newest>/bin), PORT_BASE (15601)
source "$(dirname "${BASH_SOURCE[0]}")/../lib/peers.sh"
require_venv
require runuser make cc
PG_BIN="${PG_BIN:-/usr/lib/postgresql/$(ls /usr/lib/postgresql 2>/dev/null | sort -n | tail -1)/bin}"
[[ -x "$PG_BIN/postgres" && -x "$PG_BIN/pg_config" ]] || fail "no postgres/pg_config in $PG_BIN; run bash $PEERS_ROOT/setup.sh"
PG_CONFIG="$PG_BIN/pg_config"
PG_MAJOR="$("$PG_CONFIG" --version | sed -n 's/^PostgreSQL \([0-9]*\).*/\1/p')"
[[ -n "$PG_MAJOR" ]] || fail "cannot read the PostgreSQL version from $PG_CONFIG"
PGVECTOR_VERSION="${PGVECTOR_VERSION:-0.8.6}"
ITEMS="${ITEMS:-1000000}"
DIM="${DIM:-128}"
# Inside run-all.sh with PEER_TIMEOUT set, the driver's own bound ends before that one (90 s, or
# a quarter of it if shorter).
outer="${PEER_TIMEOUT:-3390}"
PGVECTOR_SECONDS="${PGVECTOR_SECONDS:-$((outer - (outer / 4 < 90 ? outer / 4 : 90)))}"
if [[ -n "${PGVECTOR_SRC:-}" ]]; then
  PGVECTOR_SRC="$(cd "$PGVECTOR_SRC" && pwd)" || fail "PGVECTOR_SRC: no such folder"
  [[ -f "$PGVECTOR_SRC/vector.control" && -f "$PGVECTOR_SRC/Makefile" ]] || fail "PGVECTOR_SRC=$PGVECTOR_SRC holds no pgvector source"
fi

# The server's headers and PGXS (the extension build's makefiles).
dev_files() { [[ -f "$("$PG_CONFIG" --includedir-server)/postgres.h" && -f "$("$PG_CONFIG" --pgxs)" ]]; }
if ! dev_files; then
  note "pgvector: apt-get install postgresql-server-dev-$PG_MAJOR"
  apt-get update -qq
  # policy-rc.d decides whether an updated postgresql-$PG_MAJOR restarts the packaged cluster
  # (none of this script's business: its own server runs from the scratch folder).
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "postgresql-server-dev-$PG_MAJOR" >/dev/null
  dev_files || fail "postgresql-server-dev-$PG_MAJOR brought no $("$PG_CONFIG" --includedir-server)/postgres.h"
fi
# The driver's client: psycopg 3 with its own libpq (the binary wheel); numpy for the generator.
if ! (cd / && "$PEERS_PY" -c 'import psycopg, numpy' 2>/dev/null); then
  note "pgvector: pip install psycopg[binary] numpy into $PEERS_ROOT/.venv"
  "$PEERS_PY" -m pip install -q 'psycopg[binary]>=3.1,<4' 'numpy>=1.24,<3'
fi

new_scratch pgvector
chown postgres: "$SCRATCH"
machine
"$PG_BIN/postgres" --version

# pgvector: built once per PostgreSQL major and pgvector version, then reused.
PKGLIBDIR="$("$PG_CONFIG" --pkglibdir)"
CONTROL="$("$PG_CONFIG" --sharedir)/extension/vector.control"
control_version() { sed -n "s/^default_version = '\(.*\)'\$/\1/p" "$1" 2>/dev/null || true; }
wanted="$PGVECTOR_VERSION"
[[ -z "${PGVECTOR_SRC:-}" ]] || wanted="$(control_version "$PGVECTOR_SRC/vector.control")"
installed="$(control_version "$CONTROL")"
if [[ -f "$PKGLIBDIR/vector.so" && "$installed" == "$wanted" && "${PGVECTOR_REBUILD:-0}" != 1 ]]; then
  note "pgvector $installed is installed for PostgreSQL $PG_MAJOR ($PKGLIBDIR/vector.so): no build"
  echo "pgvector_compile=cached version=$installed"
else
  BUILD="$SCRATCH/pgvector-build"
  mkdir -p "$BUILD"
  pgxs_make() { make -C "$BUILD" USE_PGXS=1 PG_CONFIG="$PG_CONFIG" "$@"; }
  if [[ -n "${PGVECTOR_SRC:-}" ]]; then
    note "pgvector: building $wanted from $PGVECTOR_SRC"
    cp -a "$PGVECTOR_SRC/." "$BUILD/"  # a copy: the build's objects stay out of the user's folder
    pgxs_make -s clean >/dev/null 2>&1 || true
  else
    require curl tar
    url="https://github.com/pgvector/pgvector/archive/refs/tags/v$PGVECTOR_VERSION.tar.gz"
    note "pgvector: downloading $url"
    curl -fsSL --connect-timeout 20 --max-time 300 -o "$SCRATCH/pgvector.tar.gz" "$url" ||
      fail "cannot download $url (set PGVECTOR_SRC to a folder with pgvector's source)"
    tar -xzf "$SCRATCH/pgvector.tar.gz" -C "$BUILD" --strip-components=1 || fail "cannot unpack $url"
  fi
  began=$SECONDS
  { pgxs_make -j"$(nproc)" && pgxs_make install; } >"$SCRATCH/pgvector-build.log" 2>&1 || {
    tail -20 "$SCRATCH/pgvector-build.log" >&2
    fail "building pgvector failed (the whole log: $SCRATCH/pgvector-build.log with KEEP_SCRATCH=1)"
  }
  installed="$(control_version "$CONTROL")"
  echo "pgvector_compile_s=$((SECONDS - began)) version=$installed"
fi

free_ports PG_PORT "${PORT_BASE:-15601}" 1
DATA="$SCRATCH/data"
note "initdb: one server on 127.0.0.1:$PG_PORT"
pg_initdb "$DATA"
cat >>"$DATA/postgresql.conf" <<CONF
# the table and its index fit in shared_buffers and the HNSW graph in maintenance_work_mem while
# it is built
max_connections = 50
shared_buffers = ${SHARED_BUFFERS:-3GB}
maintenance_work_mem = ${MAINTENANCE_WORK_MEM:-3GB}
max_parallel_maintenance_workers = 1
max_wal_size = 4GB
CONF
as_postgres "$PG_BIN/pg_ctl" -D "$DATA" -o "-p $PG_PORT" -l "$DATA.log" -w -t 90 start >/dev/null ||
  fail "postgres did not start on $PG_PORT (see $DATA.log with KEEP_SCRATCH=1)"
own "$(head -1 "$DATA/postmaster.pid")" INT  # SIGINT: fast shutdown

note "pgvector_peer.py: items $ITEMS, dims $DIM (bounded to ${PGVECTOR_SECONDS}s)"
# The driver bounds its own phases by --seconds; timeout is the backstop. In the background and
# owned: timeout runs it in a process group of its own, which a TERM to this script's group (as
# run-all.sh's timeout sends) does not reach, and bash runs its TERM trap only once a foreground
# command ends but at once during `wait`; the exit trap then stops the driver (timeout passes the
# TERM on) and the server.
timeout -k 10 $((PGVECTOR_SECONDS + 60)) "$PEERS_PY" "$PEERS_ROOT/ann/pgvector_peer.py" --port "$PG_PORT" \
  --items "$ITEMS" --dim "$DIM" --queries "${QUERIES:-200}" --clients "${CLIENTS:-16}" \
  --m "${HNSW_M:-16}" --ef-construction "${EF_CONSTRUCTION:-64}" \
  --ef-search "${EF_SEARCH:-40 64 128 256}" --conc-ef "${CONC_EF-40 128}" \
  --conc-seconds "${CONC_SECONDS:-15}" --exact-queries "${EXACT_QUERIES:-3}" --seconds "$PGVECTOR_SECONDS" &
DRIVER=$!
own "$DRIVER"
code=0
wait "$DRIVER" || code=$?
disown_pid "$DRIVER"
if ((code != 0)); then
  tail -5 "$DATA.log" >&2
  fail "pgvector_peer.py exited with $code"
fi
