#!/bin/bash
# Runs the compose setup's own pieces without a Docker engine: init-secrets.sh as the tidal-init
# service runs it (root, then the files are owned by uid 10001 / 65534), the three node commands
# taken from docker-compose.yml with cluster.toml, as uid 10001 like the image's USER, each on its
# own loopback address under its service name (a private /etc/hosts, in a private network and
# mount namespace); then each node's healthcheck command exactly as written, a scrape of /metrics
# with the token Prometheus is given, and SIGTERM, which must exit 0.
#
#   TIDAL=target/debug/tidal bash deploy/compose/test-compose.sh
#
# Differences from Docker, on purpose: each node listens for HTTP on its own address rather than
# 0.0.0.0 (they share one network namespace here), and the cluster file is read from the
# repository rather than from /etc/tidal. Needs root (unshare, setpriv); otherwise "skipped: ..."
# unless TIDAL_DEPLOY_CHECK_STRICT=1.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
deadline_s=90

# shellcheck source=../in-namespace.sh
source "$here/../in-namespace.sh"
in_namespace test-compose "$0" "$@"

work="$2"
declare -A pids
cleanup() {
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

# The image's PATH (tidal and tidal-probe) and the cluster file, copied where uid 10001 can read
# them: the checkout may lie under a directory only root may enter.
mkdir -p "$work/bin"
install -m 0755 "$TIDAL" "$work/bin/tidal"
install -m 0755 "$here/../docker/tidal-probe" "$work/bin/tidal-probe"
install -m 0644 "$here/cluster.toml" "$work/cluster.toml"
export PATH="$work/bin:$PATH"

ip_of() { echo "127.0.0.2$1"; }
ip link set lo up
{
    echo "127.0.0.1 localhost"
    for id in 1 2 3; do echo "$(ip_of "$id") tidal-$id"; done
} > "$work/hosts"
mount --bind "$work/hosts" /etc/hosts
# The secrets volumes at the paths the compose file and cluster.toml name (a private /run).
mount -t tmpfs tmpfs /run
mkdir -p /run/tidal/secrets /run/tidal/metrics

echo "== tidal-init"
sh "$here/init-secrets.sh"
[ "$(stat -c '%u %a' /run/tidal/secrets/tokens.toml)" = "10001 600" ]
[ "$(stat -c '%u %a' /run/tidal/secrets/cluster-secret)" = "10001 600" ]
[ "$(stat -c '%u %a' /run/tidal/metrics/token)" = "65534 400" ]
sh "$here/init-secrets.sh" | grep -q . && { echo "test-compose: a second tidal-init run rewrote the secrets" >&2; exit 1; }
echo "secrets written once, owned by their readers"

# A service's command, healthcheck test and the like, read from docker-compose.yml.
compose_field() { # compose_field SERVICE EXPRESSION (Python, over `service`)
    python3 - "$here/docker-compose.yml" "$1" "$2" <<'PY'
import sys, yaml
service = yaml.safe_load(open(sys.argv[1]))["services"][sys.argv[2]]
value = eval(sys.argv[3], {"service": service})
print("\n".join(value) if isinstance(value, list) else value)
PY
}

echo "== tidal-1, tidal-2, tidal-3 with their compose commands"
for id in 1 2 3; do
    mapfile -t command < <(compose_field "tidal-$id" 'service["command"]')
    for i in "${!command[@]}"; do
        [ "${command[$i]}" = /etc/tidal/cluster.toml ] && command[$i]="$work/cluster.toml"
    done
    install -d -o 10001 -g 10001 -m 0700 "$work/data$id"
    TIDAL_DATA_DIR="$work/data$id" TIDAL_HTTP="$(ip_of "$id"):7070" \
        RUST_LOG=info,fjall=warn,lsm_tree=warn,openraft=warn \
        setpriv --reuid 10001 --regid 10001 --clear-groups tidal "${command[@]}" > "$work/tidal-$id.log" 2>&1 &
    pids[$id]=$!
done

for id in 1 2 3; do
    test="$(compose_field "tidal-$id" '" ".join(service["healthcheck"]["test"][1:])')"
    waited=0
    until TIDAL_PROBE_HOST="$(ip_of "$id")" sh -c "$test" 2> /dev/null; do
        if ! kill -0 "${pids[$id]}" 2>/dev/null || [ "$waited" -ge $((deadline_s * 10)) ]; then
            echo "test-compose: tidal-$id never passed its healthcheck ($test); its log:" >&2
            tail -20 "$work/tidal-$id.log" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
done
echo "every node passes its healthcheck: $test"

echo "== a Prometheus scrape with the metrics token"
for id in 1 2 3; do
    python3 - "$(ip_of "$id")" <<'PY'
import sys, urllib.request
token = open("/run/tidal/metrics/token").read().strip()
request = urllib.request.Request(f"http://{sys.argv[1]}:7070/metrics", headers={"Authorization": f"Bearer {token}"})
text = urllib.request.urlopen(request, timeout=5).read().decode()
assert "tidal_is_leader" in text and "tidal_data_dir_available_bytes" in text, text[:500]
PY
done
echo "/metrics answers the prometheus token on every node"

echo "== docker compose stop: SIGTERM, each exits 0"
for id in 1 2 3; do
    kill -TERM "${pids[$id]}"
    status=0
    wait "${pids[$id]}" || status=$?
    unset "pids[$id]"
    [ "$status" = 0 ] || { echo "test-compose: tidal-$id exited $status; its log:" >&2; tail -20 "$work/tidal-$id.log" >&2; exit 1; }
done
echo "test-compose: passed (init, 3 nodes from the compose commands, healthchecks, scrape, clean stops)"
