#!/bin/bash
# Runs start.sh the way the StatefulSet does, with the real tidal binary, on this machine: three
# "pods" in a private network and mount namespace, each on its own loopback address, their stable
# DNS names (tidal-N.tidal-peers.test.svc.cluster.local) given by a private /etc/hosts, running as
# uid/gid 10001 (runAsUser, fsGroup) with the secrets owned by root and group-readable (0440), as
# the kubelet leaves them under fsGroup. Then it scales up the way
# README.md says (pod tidal-3 starts with --join, `tidal members add`), scales down
# (`tidal members remove`, the pod stops), and stops every node with SIGTERM, which must exit 0.
#
#   TIDAL=target/debug/tidal bash deploy/kubernetes/test-start.sh
#
# Needs root for unshare (network and mount namespaces). Without it, it prints "skipped: ..." and
# passes, unless TIDAL_DEPLOY_CHECK_STRICT=1 (CI) demands it.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
probe="$here/../docker/tidal-probe"
# Every wait polls until this many seconds have passed.
deadline_s=90

# shellcheck source=../in-namespace.sh
source "$here/../in-namespace.sh"
in_namespace test-start "$0" "$@"

work="$2"
tidal="$TIDAL"
# start.sh runs `tidal` from PATH, as in the image; the pods run as uid 10001 (runAsUser), so the
# binary and the script are copied where it can read them (the checkout may not be).
mkdir -p "$work/bin"
install -m 0755 "$tidal" "$work/bin/tidal"
install -m 0755 "$here/start.sh" "$work/start.sh"
export PATH="$work/bin:$PATH"
declare -A pids

cleanup() {
    for pid in "${pids[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
}
trap cleanup EXIT

host_of() { echo "tidal-$1.tidal-peers.test.svc.cluster.local"; }
ip_of() { echo "127.0.0.1$(($1 + 1))"; }

ip link set lo up
{
    echo "127.0.0.1 localhost"
    for ordinal in 0 1 2 3; do echo "$(ip_of "$ordinal") $(host_of "$ordinal")"; done
} > "$work/hosts"
mount --bind "$work/hosts" /etc/hosts

# The Secret's keys as the kubelet mounts them under fsGroup: group-readable.
mkdir -p "$work/secrets"
admin_token="admin-$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')"
od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$work/secrets/cluster-secret"
cat > "$work/secrets/tokens.toml" <<TOKENS
[[token]]
name = "admin"
token = "$admin_token"
scopes = ["admin"]
TOKENS
chown -R 0:10001 "$work/secrets"
chmod 0750 "$work/secrets"
chmod 0440 "$work/secrets/cluster-secret" "$work/secrets/tokens.toml"
export TIDAL_TOKEN="$admin_token"

start_pod() { # start_pod ORDINAL: what the kubelet does for pod tidal-ORDINAL
    local ordinal="$1"
    # The emptyDir and the claim, writable by the pod's user and fsGroup.
    install -d -o 10001 -g 10001 -m 0700 "$work/run$ordinal" "$work/data$ordinal"
    POD_NAME="tidal-$ordinal" POD_NAMESPACE=test POD_IP="$(ip_of "$ordinal")" \
        TIDAL_HTTP_LISTEN="$(ip_of "$ordinal"):7070" TIDAL_INITIAL_NODES=3 \
        TIDAL_RUN_DIR="$work/run$ordinal" TIDAL_DATA_DIR="$work/data$ordinal" \
        TIDAL_SECRETS_DIR="$work/secrets" TIDAL_ALLOW_CLEARTEXT=true \
        RUST_LOG=info,fjall=warn,lsm_tree=warn,openraft=warn \
        setpriv --reuid 10001 --regid 10001 --clear-groups sh "$work/start.sh" > "$work/tidal-$ordinal.log" 2>&1 &
    pids[$ordinal]=$!
}

wait_ready() { # wait_ready ORDINAL: the readiness probe of the StatefulSet passes
    local ordinal="$1" waited=0
    until TIDAL_PROBE_HOST="$(ip_of "$ordinal")" "$probe" '/readyz?max_lag_ms=5000' 2> /dev/null; do
        if ! kill -0 "${pids[$ordinal]}" 2>/dev/null || [ "$waited" -ge $((deadline_s * 10)) ]; then
            echo "test-start: pod tidal-$ordinal never became ready; its log:" >&2
            tail -20 "$work/tidal-$ordinal.log" >&2
            exit 1
        fi
        sleep 0.1
        waited=$((waited + 1))
    done
}

stop_pod() { # stop_pod ORDINAL: SIGTERM, as on a pod's deletion; a clean stop exits 0
    local ordinal="$1" status=0
    kill -TERM "${pids[$ordinal]}"
    wait "${pids[$ordinal]}" || status=$?
    unset "pids[$ordinal]"
    if [ "$status" != 0 ]; then
        echo "test-start: tidal-$ordinal exited $status after SIGTERM; its log:" >&2
        tail -20 "$work/tidal-$ordinal.log" >&2
        exit 1
    fi
}

voters() { # voters: the voter count the cluster reports
    tidal status --url "http://$(host_of 0):7070" | tee "$work/status.txt" >/dev/null
    grep -c -E '^\s*[0-9]+\s+(leader|follower)' "$work/status.txt" || true
}

echo "== three pods start together (podManagementPolicy: Parallel)"
for ordinal in 0 1 2; do start_pod "$ordinal"; done
for ordinal in 0 1 2; do wait_ready "$ordinal"; done
grep -q "^id = 3$" "$work/run0/cluster.toml"
[ "$(stat -c %a "$work/run0/cluster-secret")" = 600 ]
[ "$(stat -c %a "$work/run0/tokens.toml")" = 600 ]
tidal stream publish deploy-check '{"n":1}' --url "http://$(host_of 1):7070" > /dev/null
echo "three nodes ready under their DNS names; a write through a follower was acknowledged"

echo "== scale up: pod tidal-3 (node 4) starts with --join and is added"
POD_NAME=tidal-3 POD_NAMESPACE=test TIDAL_RUN_DIR="$work/dry-run" TIDAL_START_DRY_RUN=1 \
    sh "$here/start.sh" | grep -q -- "--node-id 4 .*--join"
start_pod 3
tidal members add --url "http://$(host_of 0):7070" --node 4 \
    --http "$(host_of 3):7070" --rpc "$(host_of 3):7170" --catch-up-s 60 > "$work/add.txt"
wait_ready 3
count="$(voters)"
[ "$count" = 4 ] || { echo "test-start: expected 4 voters after members add, status says $count:" >&2; cat "$work/status.txt" >&2; exit 1; }
echo "node 4 joined: 4 voters"

echo "== scale down: node 4 removed, then its pod stopped"
tidal members remove --url "http://$(host_of 0):7070" --node 4 > "$work/remove.txt"
stop_pod 3
count="$(voters)"
[ "$count" = 3 ] || { echo "test-start: expected 3 voters after members remove, status says $count:" >&2; cat "$work/status.txt" >&2; exit 1; }
echo "node 4 removed: 3 voters"

echo "== every pod deleted: SIGTERM, each exits 0"
for ordinal in 0 1 2; do stop_pod "$ordinal"; done
echo "test-start: passed (3 pods up by DNS name, scaled to 4 and back to 3, clean SIGTERM stops)"
