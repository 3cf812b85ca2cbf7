#!/bin/bash
# Offline checks of everything under deploy/ (`make deploy-check`; CI runs it). No Docker engine,
# Kubernetes API server or systemd is needed: each file is checked by the tool that knows its
# format, and the Kubernetes start script runs for real against the tidal binary ($TIDAL).
#
# Tools: systemd-analyze (systemd), docker-compose (Debian's docker-compose) or `docker compose`,
# promtool (Debian's prometheus), kubernetes-validate and dockerfile (PyPI), python3 with PyYAML,
# kubectl when present (its built-in kustomize). A missing tool fails the check when
# TIDAL_DEPLOY_CHECK_STRICT=1 (CI) and is reported as "skipped: ..." otherwise.
set -euo pipefail
cd "$(dirname "$0")/.."

strict="${TIDAL_DEPLOY_CHECK_STRICT:-0}"
failed=0
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

missing() { # missing TOOL WHY
    if [ "$strict" = "1" ]; then
        echo "deploy-check: FAIL $1 is not installed ($2)"
        failed=1
    else
        echo "deploy-check: skipped: $1 is not installed ($2)"
    fi
}

step() { # step NAME COMMAND...: runs it, reports, and records a failure
    local name="$1"
    shift
    if "$@" > "$work/out" 2>&1; then
        echo "deploy-check: $name: ok"
        sed 's/^/    /' "$work/out" | tail -n 5
    else
        echo "deploy-check: $name: FAILED"
        sed 's/^/    /' "$work/out"
        failed=1
    fi
}

# systemd: the unit as systemd would load it (an unknown key or bad value is printed, so any output
# fails). verify wants the ExecStart binary to exist: the copy points at /usr/bin/true.
systemd_verify() {
    mkdir -p "$work/systemd"
    sed 's#/usr/local/bin/tidal#/usr/bin/true#' deploy/systemd/tidal@.service > "$work/systemd/tidal@1.service"
    local out
    out="$(systemd-analyze verify --man=no "$work/systemd/tidal@1.service" 2>&1)"
    [ -z "$out" ] || { echo "$out"; return 1; }
    echo "tidal@1.service loads without warnings"
}
if command -v systemd-analyze > /dev/null; then
    step "systemd unit (systemd-analyze verify)" systemd_verify
else
    missing systemd-analyze "apt-get install systemd"
fi

# Compose: the file against Compose's schema, then its pieces against each other.
if docker compose version > /dev/null 2>&1; then
    step "compose file (docker compose config)" docker compose -f deploy/compose/docker-compose.yml config --quiet
elif command -v docker-compose > /dev/null; then
    step "compose file (docker-compose config)" docker-compose -f deploy/compose/docker-compose.yml config --quiet
else
    missing docker-compose "apt-get install docker-compose"
fi
step "compose structure" python3 deploy/check_deploy.py compose
if [ -n "${TIDAL:-}" ] && [ -x "$TIDAL" ]; then
    step "compose pieces with the real binary (tidal-init, node commands, healthchecks, scrape)" \
        bash deploy/compose/test-compose.sh
else
    missing tidal "set TIDAL to the tidal binary to run the compose pieces for real"
fi

# The image: BuildKit's parser, then what the Dockerfile must do.
if python3 -c "import dockerfile" 2> /dev/null; then
    step "Dockerfile (BuildKit parser and rules)" python3 deploy/check_deploy.py dockerfile
else
    missing "python dockerfile" "pip install dockerfile"
fi
step "image probe script (bash -n)" bash -n deploy/docker/tidal-probe

# Kubernetes: the manifests against the API's schemas (strict: unknown fields fail), as written
# and as kustomize renders them; then their pieces against each other; then start.sh for real.
step "kubernetes start script (sh -n)" sh -n deploy/kubernetes/start.sh
if command -v kubernetes-validate > /dev/null; then
    step "kubernetes manifests (kubernetes-validate --strict)" kubernetes-validate --strict --quiet \
        deploy/kubernetes/services.yaml deploy/kubernetes/statefulset.yaml \
        deploy/kubernetes/poddisruptionbudget.yaml deploy/kubernetes/secret.example.yaml
    if command -v kubectl > /dev/null; then
        render() { kubectl kustomize deploy/kubernetes > "$work/rendered.yaml" && kubernetes-validate --strict --quiet "$work/rendered.yaml"; }
        step "kustomize output (kubectl kustomize, kubernetes-validate --strict)" render
        step "kubernetes structure (rendered)" python3 deploy/check_deploy.py kubernetes "$work/rendered.yaml"
    else
        echo "deploy-check: skipped: kubectl is not installed (the kustomize rendering is not checked; the files are)"
        step "kubernetes structure" python3 deploy/check_deploy.py kubernetes deploy/kubernetes/services.yaml \
            deploy/kubernetes/statefulset.yaml deploy/kubernetes/poddisruptionbudget.yaml
    fi
else
    missing kubernetes-validate "pip install kubernetes-validate"
fi
if [ -n "${TIDAL:-}" ] && [ -x "$TIDAL" ]; then
    step "kubernetes start.sh with the real binary (3 pods, scale to 4 and back)" bash deploy/kubernetes/test-start.sh
else
    missing tidal "set TIDAL to the tidal binary to run start.sh for real"
fi

# Prometheus: the rules, their unit tests, and the compose Prometheus configuration.
if command -v promtool > /dev/null; then
    step "prometheus rules (promtool check rules)" promtool check rules deploy/prometheus/tidal-rules.yml
    step "prometheus rule tests (promtool test rules)" promtool test rules deploy/prometheus/tidal-rules.test.yml
    step "compose prometheus.yml (promtool check config)" promtool check config --syntax-only deploy/compose/prometheus.yml
else
    missing promtool "apt-get install prometheus"
fi
step "grafana dashboard (JSON)" python3 -c "import json,sys; d=json.load(open('deploy/prometheus/tidal-dashboard.json')); print(len(d['panels']), 'panels')"

if [ "$failed" = 0 ]; then
    echo "deploy-check: all checks passed"
else
    echo "deploy-check: FAILED"
fi
exit "$failed"
