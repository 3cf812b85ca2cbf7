#!/bin/sh
# Run once by the tidal-init service as root: writes the cluster secret, the token file and the
# metrics token into their volumes if they are not there yet (a restart keeps them), owned by the
# users that read them and readable by nobody else (tidal refuses group/world-readable files).
set -eu
secrets=/run/tidal/secrets
metrics=/run/tidal/metrics
tidal_uid=10001
prometheus_uid=65534

random_hex() {
    # 32 random bytes as 64 hex digits.
    od -An -N32 -tx1 /dev/urandom | tr -d ' \n'
}

umask 077
if [ ! -s "$secrets/cluster-secret" ]; then
    random_hex > "$secrets/cluster-secret"
    echo "tidal-init: wrote a new cluster secret"
fi
if [ ! -s "$secrets/tokens.toml" ]; then
    metrics_token=$(random_hex)
    cat > "$secrets/tokens.toml" <<TOKENS
# Written by tidal-init. Read the admin token with:
#   docker compose exec tidal-1 cat /run/tidal/secrets/tokens.toml
[[token]]
name = "admin"
token = "$(random_hex)"
scopes = ["admin"]

[[token]]
name = "prometheus"
token = "$metrics_token"
scopes = ["read"]
TOKENS
    printf '%s' "$metrics_token" > "$metrics/token"
    echo "tidal-init: wrote a new token file (admin, prometheus)"
fi
chown -R "$tidal_uid:$tidal_uid" "$secrets"
chmod 0700 "$secrets"
chmod 0600 "$secrets/cluster-secret" "$secrets/tokens.toml"
chown -R "$prometheus_uid:$prometheus_uid" "$metrics"
chmod 0700 "$metrics"
chmod 0400 "$metrics/token"
