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
from pathlib import Path

import pytest
import yaml

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


def test_k8s_configmaps_match_deploy_files() -> None:
    objects = {d["metadata"]["name"]: d for items in k8s_docs().values() for d in items
               if "metadata" in d}
    assert objects["specroute-config"]["data"]["config.yaml"] == CONFIG.read_text()
    assert objects["otel-collector-config"]["data"]["config.yaml"] == \
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
