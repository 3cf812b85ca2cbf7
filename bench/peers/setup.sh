#!/usr/bin/env bash
# Installs what the peer scripts need; safe to run again (it only adds what is missing).
#   bash bench/peers/setup.sh
# Needs root and Debian 12's packages (apt-get), and PyPI for the Python clients:
#   - the peers: redis-server + redis-tools (Redis 7.0: redis-server, redis-cli, redis-benchmark),
#     postgresql (15: postgres, initdb, pg_basebackup, pgbench, psql), nats-server (2.9),
#     etcd-server + etcd-client (3.4: etcd, etcdctl);
#   - a Python venv in .venv beside this file with the clients the load generators use:
#     redis (Redis), nats-py (NATS JetStream), grpcio (etcd's gRPC API).
# No compiler and no Go toolchain: the load generators are Python or the peers' own tools.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

DEBIAN_PACKAGES=(redis-server redis-tools postgresql nats-server etcd-server etcd-client)
absent=()
for package in "${DEBIAN_PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${db:Status-Status}' "$package" 2>/dev/null | grep -qx installed; then
    absent+=("$package")
  fi
done
if ((${#absent[@]} > 0)); then
  echo "setup: apt-get install ${absent[*]}" >&2
  apt-get update -qq
  # The packaged services are not used (each script starts its own servers on other ports);
  # where policy-rc.d is absent they may start on their default ports: stop them with the
  # distribution's service tool if you do not want them.
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${absent[@]}" >/dev/null
fi

# The venv belongs to this copy: a venv copied from elsewhere still points at its old path
# (its scripts' #! lines), so a foreign one is made anew.
VENV="$ROOT/.venv"
if [[ -x "$VENV/bin/python" ]] &&
  [[ "$(cd / && "$VENV/bin/python" -c 'import sys; print(sys.prefix)' 2>/dev/null)" != "$VENV" ]]; then
  echo "setup: $VENV was made for another folder; making it again" >&2
  rm -rf "$VENV"
fi
if [[ ! -x "$VENV/bin/python" ]]; then
  "${PYTHON:-python3}" -m venv "$VENV" || {
    echo "setup: python3 -m venv failed (on Debian's python3: apt-get install python3-venv)" >&2
    exit 1
  }
fi
# Checked from / so that no folder here can stand in for a package.
if ! (cd / && "$VENV/bin/python" -c 'import redis.client, nats.js, grpc' 2>/dev/null); then
  echo "setup: pip install redis nats-py grpcio into $VENV" >&2
  "$VENV/bin/python" -m pip install -q 'redis>=5,<9' 'nats-py>=2.6,<3' 'grpcio>=1.60,<2'
fi
echo "setup ok: $(redis-server --version | grep -o 'v=[0-9.]*'), postgres $(ls /usr/lib/postgresql | sort -n | tail -1)," \
  "nats-server $(nats-server --version 2>&1 | grep -o '[0-9][0-9.]*' | head -1), etcd $(etcd --version 2>&1 | awk 'NR == 1 {print $3}')"
