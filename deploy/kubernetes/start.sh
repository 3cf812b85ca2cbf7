#!/bin/sh
# Start script of a Tidal pod in the StatefulSet (mounted from the tidal-start ConfigMap).
#
# It turns what Kubernetes gives a pod into what `tidal serve` needs:
# - the node id from the pod's ordinal: pod tidal-0 is node 1, tidal-1 node 2, ... (node id 0 is not
#   allowed in a cluster file);
# - the cluster file, written to /run/tidal/cluster.toml: nodes 1..max(TIDAL_INITIAL_NODES, own id),
#   each addressed by its pod's stable DNS name under the headless Service. A node whose id is above
#   TIDAL_INITIAL_NODES was added by scaling up: it starts with --join and waits for
#   `tidal members add` (README.md, "Scaling");
# - private copies of the secrets: the server refuses a token file, cluster secret or TLS key that
#   group or others may read, and with the pod's fsGroup the kubelet makes secret volume files
#   group-readable (0440) whatever defaultMode says. The copies live in a memory-backed emptyDir,
#   owned by the tidal user, mode 0600.
# Then it waits until the pod's own DNS name points at the pod (the replication port binds that
# name), and execs tidal, which then gets SIGTERM itself.
# TIDAL_START_DRY_RUN=1 prints the cluster file and the command instead of running them.
set -eu

pod_name="${POD_NAME:?POD_NAME (the downward API's metadata.name) is required}"
namespace="${POD_NAMESPACE:?POD_NAMESPACE is required}"
initial_nodes="${TIDAL_INITIAL_NODES:-3}"
peer_service="${TIDAL_PEER_SERVICE:-tidal-peers}"
cluster_domain="${TIDAL_CLUSTER_DOMAIN:-cluster.local}"
cluster_id="${TIDAL_CLUSTER_ID:-tidal}"
http_port="${TIDAL_HTTP_PORT:-7070}"
rpc_port="${TIDAL_RPC_PORT:-7170}"
secrets="${TIDAL_SECRETS_DIR:-/etc/tidal/secrets}"
tls="${TIDAL_TLS_DIR:-/etc/tidal/tls}"
run="${TIDAL_RUN_DIR:-/run/tidal}"
dns_wait_s="${TIDAL_DNS_WAIT_S:-120}"
data_dir="${TIDAL_DATA_DIR:-/var/lib/tidal}"
# Where HTTP listens; peers and clients use the DNS name, whatever IP is behind it.
http_listen="${TIDAL_HTTP_LISTEN:-0.0.0.0:$http_port}"

statefulset="${pod_name%-*}"
ordinal="${pod_name##*-}"
case "$ordinal" in
    ''|*[!0-9]*) echo "start.sh: pod name $pod_name does not end in -ORDINAL" >&2; exit 2 ;;
esac
node_id=$((ordinal + 1))
last_node=$initial_nodes
if [ "$node_id" -gt "$last_node" ]; then last_node=$node_id; fi

host_of() { # host_of ID: the stable DNS name of node ID's pod
    echo "$statefulset-$(($1 - 1)).$peer_service.$namespace.svc.$cluster_domain"
}

umask 077
mkdir -p "$run"
{
    echo "# Written by start.sh for node $node_id (pod $pod_name)."
    echo "cluster_id = \"$cluster_id\""
    echo "secret_file = \"$run/cluster-secret\""
    echo "durability = \"${TIDAL_DURABILITY_MODE:-quorum}\""
    id=1
    while [ "$id" -le "$last_node" ]; do
        host=$(host_of "$id")
        printf '\n[[node]]\nid = %s\nhttp = "%s:%s"\nrpc = "%s:%s"\n' "$id" "$host" "$http_port" "$host" "$rpc_port"
        id=$((id + 1))
    done
} > "$run/cluster.toml"

set -- serve --cluster "$run/cluster.toml" --node-id "$node_id" --data-dir "$data_dir" \
    --http "$http_listen" --token-file "$run/tokens.toml"
if [ "$node_id" -gt "$initial_nodes" ]; then
    set -- "$@" --join
fi
if [ -f "$tls/tls.crt" ]; then
    # A kubernetes.io/tls Secret (with ca.crt, as cert-manager writes it). Copied like the other
    # secrets, so a renewed certificate takes effect at the pod's next start (a rollout restart).
    set -- "$@" --tls-cert "$run/tls.crt" --tls-key "$run/tls.key" --tls-ca "$run/ca.crt"
elif [ "${TIDAL_ALLOW_CLEARTEXT:-false}" = "true" ]; then
    # No TLS: tokens and data cross the pod network in cleartext. Only on a network you trust.
    set -- "$@" --insecure
fi

if [ "${TIDAL_START_DRY_RUN:-0}" = "1" ]; then
    cat "$run/cluster.toml"
    echo "tidal $*"
    exit 0
fi

install -m 0600 "$secrets/cluster-secret" "$run/cluster-secret"
install -m 0600 "$secrets/tokens.toml" "$run/tokens.toml"
if [ -f "$tls/tls.crt" ]; then
    install -m 0644 "$tls/tls.crt" "$run/tls.crt"
    install -m 0600 "$tls/tls.key" "$run/tls.key"
    install -m 0644 "$tls/ca.crt" "$run/ca.crt"
fi

# The headless Service publishes the pod's name once it has an IP (publishNotReadyAddresses), and
# a restarted pod's name may still point at its old IP for a few seconds: binding it then fails.
own_host=$(host_of "$node_id")
waited=0
while [ "$waited" -lt "$dns_wait_s" ]; do
    resolved=$(getent hosts "$own_host" | awk '{print $1; exit}') || resolved=""
    if [ -n "$resolved" ] && { [ -z "${POD_IP:-}" ] || [ "$resolved" = "$POD_IP" ]; }; then
        break
    fi
    sleep 1
    waited=$((waited + 1))
done
if [ "$waited" -ge "$dns_wait_s" ]; then
    echo "start.sh: $own_host does not resolve to this pod (${POD_IP:-?}) after ${dns_wait_s}s; starting anyway" >&2
fi
echo "start.sh: node $node_id of $last_node (initial $initial_nodes) as $own_host"
exec tidal "$@"
