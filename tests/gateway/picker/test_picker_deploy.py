"""deploy/k8s/gaie hangs together: an InferencePool (GAIE v1 API) of the base fleet's
SGLang pods, the picker's Deployment and Service it points at, an HTTPRoute to the pool,
and the overlay's patch of the base workers (label, pod-IP registration)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from gateway.config import parse_config
from specroute.cli import build_parser

ROOT = Path(__file__).resolve().parents[3]
GAIE = ROOT / "deploy/k8s/gaie"


def docs(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def objects() -> dict[tuple[str, str], dict]:
    out = {}
    for path in sorted(GAIE.glob("*.yaml")):
        if path.name != "kustomization.yaml":
            for doc in docs(path):
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def kustomization() -> dict:
    return docs(GAIE / "kustomization.yaml")[0]


def base_workers() -> list[dict]:
    return [d for d in docs(ROOT / "deploy/k8s/sglang-workers.yaml")
            if d["kind"] == "Deployment"]


def test_the_overlay_lists_its_files_and_the_base() -> None:
    resources = kustomization()["resources"]
    assert resources[0] == "../" and (GAIE.parent / "kustomization.yaml").exists()
    assert sorted(resources[1:]) == sorted(p.name for p in GAIE.glob("*.yaml")
                                           if p.name != "kustomization.yaml")


def test_the_inference_pool_points_at_the_picker_and_selects_the_patched_pods() -> None:
    found = objects()
    [pool] = [o for (kind, _), o in found.items() if kind == "InferencePool"]
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"
    spec = pool["spec"]
    ref = spec["endpointPickerRef"]
    service = found[("Service", ref["name"])]
    assert ref["kind"] == "Service" and ref["failureMode"] in ("FailClose", "FailOpen")
    assert ref["port"]["number"] == service["spec"]["ports"][0]["port"] == 9002
    assert service["spec"]["ports"][0]["appProtocol"] == "http2"  # gRPC
    # the pods: the base's SGLang workers, labelled by the overlay's patch
    [patch] = kustomization()["patches"]
    names = re.compile(patch["target"]["name"] + "$")
    patched = [d for d in base_workers() if names.match(d["metadata"]["name"])]
    assert len(patched) == len(base_workers()) == 6
    body = yaml.safe_load(patch["patch"])
    labels = body["spec"]["template"]["metadata"]["labels"]
    assert spec["selector"]["matchLabels"].items() <= labels.items()
    ports = {c["containerPort"] for d in patched
             for c in d["spec"]["template"]["spec"]["containers"][0]["ports"]}
    assert [p["number"] for p in spec["targetPorts"]] == sorted(ports) == [30000]
    route = found[("HTTPRoute", pool["metadata"]["name"])]
    [backend] = route["spec"]["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io", "InferencePool", pool["metadata"]["name"])


def test_the_patched_workers_register_their_pod_ip_and_keep_their_env() -> None:
    """The picker names pods as ip:port, so workers register under the pod IP; the patch
    replaces the env list whole, so it must keep every variable the base sets."""
    body = yaml.safe_load(kustomization()["patches"][0]["patch"])
    [container] = body["spec"]["template"]["spec"]["containers"]
    env = [e for e in container["env"] if "$patch" not in e]
    assert container["env"][0] == {"$patch": "replace"}
    names = [e["name"] for e in env]
    assert names.index("POD_IP") < names.index("SPECROUTE_ADVERTISE_URL")  # $(POD_IP) order
    advertise = next(e["value"] for e in env if e["name"] == "SPECROUTE_ADVERTISE_URL")
    assert advertise == "http://$(POD_IP):30000"
    for deployment in base_workers():
        [base] = deployment["spec"]["template"]["spec"]["containers"]
        assert base["name"] == container["name"]
        assert {e["name"] for e in base["env"]} <= set(names)


def test_the_picker_deployment_runs_specroute_picker_with_grpc_probes() -> None:
    found = objects()
    deployment = found[("Deployment", "specroute-epp")]
    spec = deployment["spec"]
    assert spec["selector"]["matchLabels"].items() <= \
        spec["template"]["metadata"]["labels"].items()
    [container] = spec["template"]["spec"]["containers"]
    args = build_parser().parse_args(container["args"])
    assert args.command == "picker" and args.host == "0.0.0.0" and args.port == 9002
    assert args.max_endpoints == 1  # GAIE's Envoy Gateway patch: an ORIGINAL_DST cluster
    assert container["livenessProbe"]["grpc"] == {"port": 9002, "service": "liveness"}
    assert container["readinessProbe"]["grpc"] == {"port": 9002, "service": "readiness"}
    [volume] = spec["template"]["spec"]["volumes"]
    config_map = next(d for d in docs(ROOT / "deploy/k8s/config.yaml")
                      if d["metadata"]["name"] == volume["configMap"]["name"])
    config = parse_config(yaml.safe_load(config_map["data"]["config.yaml"]))
    assert args.config == f"{container['volumeMounts'][0]['mountPath']}/config.yaml"
    assert config.redis_url  # the pods' IPs come from the worker registry
