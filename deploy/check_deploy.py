#!/usr/bin/env python3
"""Structure checks of deploy/ that no schema makes: the pieces of each setup agree with each other.

    python3 deploy/check_deploy.py compose      # docker-compose.yml, cluster.toml, prometheus.yml, grafana
    python3 deploy/check_deploy.py dockerfile   # deploy/Dockerfile, parsed by BuildKit's own parser
    python3 deploy/check_deploy.py kubernetes FILE...  # manifests (kustomize output or the raw files)

Each prints one line per check group and exits 1 naming every failed check. deploy/check.sh runs them
with the schema tools (docker-compose config, kubernetes-validate, promtool, systemd-analyze).
Needs PyYAML; `dockerfile` needs the PyPI package `dockerfile`.
"""

import os
import re
import sys
import tomllib

import yaml

DEPLOY = os.path.dirname(os.path.abspath(__file__))
REPOSITORY = os.path.dirname(DEPLOY)
DATA_DIR = "/var/lib/tidal"
# The server refuses secret files with any group or other bit (crates/tidal-server/src/auth.rs).
PRIVATE_MASK = 0o077


class Checks:
    """Collects failures instead of stopping at the first, so one run names every problem."""

    def __init__(self, group):
        self.group = group
        self.failures = []
        self.count = 0

    def check(self, condition, what):
        self.count += 1
        if not condition:
            self.failures.append(what)
        return condition

    def finish(self):
        if self.failures:
            for failure in self.failures:
                print(f"{self.group}: FAIL {failure}")
            return 1
        print(f"{self.group}: {self.count} checks passed")
        return 0


def host_port(address):
    host, _, port = address.rpartition(":")
    return host, int(port)


def option(command, name):
    """The value after `name` in an argv list, or None."""
    if name in command:
        index = command.index(name)
        return command[index + 1] if index + 1 < len(command) else None
    return None


def check_compose():
    checks = Checks("compose")
    here = os.path.join(DEPLOY, "compose")
    with open(os.path.join(here, "docker-compose.yml")) as file:
        compose = yaml.safe_load(file)
    with open(os.path.join(here, "cluster.toml"), "rb") as file:
        cluster = tomllib.load(file)
    with open(os.path.join(here, "prometheus.yml")) as file:
        prometheus = yaml.safe_load(file)
    services = compose["services"]
    declared_volumes = set((compose.get("volumes") or {}).keys())
    nodes = {name: service for name, service in services.items() if "serve" in (service.get("command") or [])}
    checks.check(len(nodes) == 3, f"3 node services, found {sorted(nodes)}")
    cluster_nodes = {node["id"]: node for node in cluster["node"]}
    data_volumes = set()
    for name, service in nodes.items():
        command = service["command"]
        node_id = option(command, "--node-id")
        checks.check(node_id is not None and int(node_id) in cluster_nodes, f"{name}: --node-id {node_id} is in cluster.toml")
        if node_id is not None and int(node_id) in cluster_nodes:
            entry = cluster_nodes[int(node_id)]
            checks.check(host_port(entry["http"])[0] == name, f"{name}: cluster.toml http {entry['http']} names the service")
            checks.check(host_port(entry["rpc"])[0] == name, f"{name}: cluster.toml rpc {entry['rpc']} names the service")
        volumes = service.get("volumes") or []
        data = [v.split(":")[0] for v in volumes if v.split(":")[1] == DATA_DIR]
        checks.check(len(data) == 1 and data[0] in declared_volumes, f"{name}: a named volume at {DATA_DIR}: {data}")
        data_volumes.update(data)
        test = " ".join(service.get("healthcheck", {}).get("test", []))
        checks.check("/healthz" in test, f"{name}: healthcheck probes /healthz")
        checks.check(re.search(r"/readyz\?max_lag_ms=\d+", test) is not None, f"{name}: healthcheck probes /readyz?max_lag_ms=")
        checks.check(service.get("restart") == "on-failure", f"{name}: restart: on-failure (a fatal fault exits on purpose)")
        checks.check(str(service.get("user", "0")).split(":")[0] not in ("0", "root"), f"{name}: runs as a non-root user")
        grace = str(service.get("stop_grace_period", "10s"))
        checks.check(grace.endswith("s") and int(grace[:-1]) >= 30, f"{name}: stop_grace_period >= 30s, is {grace}")
        token_file = option(command, "--token-file")
        secret_mounts = [v.split(":")[1] for v in volumes if v.endswith(":ro") and "secret" in v.split(":")[0]]
        checks.check(
            token_file is not None and any(token_file.startswith(m + "/") for m in secret_mounts),
            f"{name}: --token-file {token_file} is on a read-only secrets volume {secret_mounts}",
        )
        checks.check(
            any(cluster["secret_file"].startswith(m + "/") for m in secret_mounts),
            f"{name}: cluster secret_file {cluster['secret_file']} is on its secrets volume",
        )
        for volume in volumes:
            source = volume.split(":")[0]
            if source.startswith("."):
                checks.check(os.path.exists(os.path.join(here, source)), f"{name}: bind-mount source {source} exists")
    checks.check(len(data_volumes) == len(nodes), f"every node has its own data volume: {sorted(data_volumes)}")
    checks.check(sorted(cluster_nodes) == sorted(int(option(s["command"], "--node-id")) for s in nodes.values()),
                 "cluster.toml lists exactly the node services")
    targets = [t for job in prometheus["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    checks.check(sorted(targets) == sorted(n["http"] for n in cluster_nodes.values()),
                 f"Prometheus scrapes every node's http address: {targets}")
    rule_mounts = [v for v in services["prometheus"]["volumes"] if "tidal-rules.yml" in v]
    checks.check(any(v.split(":")[1] in prometheus["rule_files"] for v in rule_mounts), "Prometheus loads the mounted rules file")
    for name in ("prometheus", "grafana"):
        for volume in services[name]["volumes"]:
            source = volume.split(":")[0]
            if source.startswith("."):
                checks.check(os.path.exists(os.path.join(here, source)), f"{name}: bind-mount source {source} exists")
    with open(os.path.join(here, "grafana", "dashboards.yml")) as file:
        provider_path = yaml.safe_load(file)["providers"][0]["options"]["path"]
    dashboards = [v.split(":")[1] for v in services["grafana"]["volumes"] if v.endswith(".json:ro")]
    checks.check(dashboards and all(os.path.dirname(d) == provider_path for d in dashboards),
                 f"the dashboard is mounted where the provider reads: {dashboards} under {provider_path}")
    return checks.finish()


def check_dockerfile():
    import dockerfile  # BuildKit's parser (PyPI `dockerfile`), imported here: only this check needs it

    checks = Checks("dockerfile")
    path = os.path.join(DEPLOY, "Dockerfile")
    commands = dockerfile.parse_file(path)
    stages = [c for c in commands if c.cmd.upper() == "FROM"]
    checks.check(len(stages) >= 2, "multi-stage: a build stage and a runtime stage")
    final = commands[commands.index(stages[-1]):]
    by_cmd = lambda stage, name: [c for c in stage if c.cmd.upper() == name]
    users = by_cmd(final, "USER")
    checks.check(users and users[-1].value[0].split(":")[0] not in ("0", "root"), "the runtime stage runs as a non-root USER")
    checks.check(by_cmd(final, "HEALTHCHECK"), "the runtime stage has a HEALTHCHECK")
    checks.check(by_cmd(final, "ENTRYPOINT"), "the runtime stage has an ENTRYPOINT")
    checks.check(any("--from=build" in c.flags for c in by_cmd(final, "COPY")), "the binary is copied from the build stage")
    runs = " ".join(" ".join(c.value) for c in commands if c.cmd.upper() == "RUN")
    checks.check("cargo build --release --locked -p tidal-cli --bin tidal" in runs, "builds the tidal binary from Cargo.lock")
    for copy in by_cmd(final, "COPY"):
        if not any(flag.startswith("--from") for flag in copy.flags):
            for source in copy.value[:-1]:
                checks.check(os.path.exists(os.path.join(REPOSITORY, source)), f"COPY source {source} exists in the repository")
    for stage in stages:
        image = stage.value[0]
        checks.check(":" in image and not image.endswith(":latest"), f"base image {image} is pinned to a tag")
    checks.check(os.path.exists(path + ".dockerignore"), "Dockerfile.dockerignore keeps target/ out of the context")
    return checks.finish()


def check_kubernetes(paths):
    checks = Checks("kubernetes")
    objects = []
    for path in paths:
        with open(path) as file:
            objects.extend(o for o in yaml.safe_load_all(file) if o)
    kinds = {}
    for obj in objects:
        kinds.setdefault(obj["kind"], []).append(obj)
    statefulset = kinds["StatefulSet"][0]
    spec = statefulset["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    container = pod["containers"][0]
    services = {s["metadata"]["name"]: s for s in kinds.get("Service", [])}
    peers = services.get(spec["serviceName"])
    matches = lambda selector: all(labels.get(k) == v for k, v in selector.items())
    checks.check(peers is not None and peers["spec"].get("clusterIP") == "None", f"serviceName {spec['serviceName']} is a headless Service")
    checks.check(peers is not None and peers["spec"].get("publishNotReadyAddresses") is True,
                 "the peers' Service publishes pods before they are ready (a node is ready only once there is a leader)")
    checks.check(any(not s["spec"].get("publishNotReadyAddresses") and s["spec"].get("clusterIP") != "None" and matches(s["spec"]["selector"])
                     for s in services.values()), "a client Service selects the pods (ready ones only)")
    claims = [t["metadata"]["name"] for t in spec.get("volumeClaimTemplates", [])]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    checks.check(any(c in mounts and mounts[c]["mountPath"] == DATA_DIR for c in claims), f"a volumeClaimTemplate is mounted at {DATA_DIR}")
    liveness = container.get("livenessProbe", {}).get("httpGet", {}).get("path")
    readiness = container.get("readinessProbe", {}).get("httpGet", {}).get("path", "")
    checks.check(liveness == "/healthz", f"liveness probes /healthz, is {liveness}")
    checks.check(re.fullmatch(r"/readyz\?max_lag_ms=\d+", readiness) is not None, f"readiness probes /readyz?max_lag_ms=, is {readiness}")
    checks.check(pod.get("terminationGracePeriodSeconds", 30) >= 60, "terminationGracePeriodSeconds leaves time for a graceful stop")
    checks.check(pod["securityContext"].get("runAsNonRoot") is True, "pods run as non-root")
    secrets = [v for v in pod["volumes"] if "secret" in v]
    checks.check(secrets and all(v["secret"].get("defaultMode", 0o644) & PRIVATE_MASK == 0 for v in secrets),
                 "secret volumes are mounted owner-only (defaultMode 0400)")
    checks.check(any("start.sh" in part for part in container.get("command", [])), "the container runs start.sh (node id from the ordinal)")
    env = {e["name"]: e.get("value") for e in container.get("env", [])}
    checks.check(env.get("TIDAL_INITIAL_NODES") == str(spec["replicas"]), "TIDAL_INITIAL_NODES equals the initial replicas")
    checks.check(env.get("TIDAL_PEER_SERVICE") == spec["serviceName"], "start.sh names the peers' Service")
    budgets = kinds.get("PodDisruptionBudget", [])
    checks.check(budgets and matches(budgets[0]["spec"]["selector"]["matchLabels"]), "a PodDisruptionBudget covers the pods")
    checks.check(budgets and budgets[0]["spec"].get("maxUnavailable") == 1, "at most one voter of 3 away at once")
    config_maps = [v["configMap"]["name"] for v in pod["volumes"] if "configMap" in v]
    if "ConfigMap" in kinds:
        names = {c["metadata"]["name"] for c in kinds["ConfigMap"]}
        checks.check(all(name in names for name in config_maps), f"the ConfigMaps the pods mount exist: {config_maps}")
    return checks.finish()


def main(argv):
    if len(argv) < 2:
        print(__doc__)
        return 2
    what = argv[1]
    if what == "compose":
        return check_compose()
    if what == "dockerfile":
        return check_dockerfile()
    if what == "kubernetes":
        return check_kubernetes(argv[2:])
    print(f"unknown check {what}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
