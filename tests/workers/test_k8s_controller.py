"""The Kubernetes fleet controller (workers/fleet/k8s_controller.py) through the official
`kubernetes` client against a local fake API server (this one seam): it scales the
pool Deployments one move at a time, waits while a Deployment is not ready, never goes
below the minimum, and calls exactly what its RBAC (deploy/k8s/fleet-controller.yaml)
allows."""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

kubernetes = pytest.importorskip("kubernetes")

from policies.keys import desired_fleet_key  # noqa: E402
from policies.planner import FleetPlan  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
PATH = re.compile(r"^/apis/apps/v1/namespaces/([^/]+)/deployments/([^/]+)(/scale)?$")


class FakeApps:
    """Deployments' spec.replicas and status.readyReplicas; `auto_ready` plays the kubelet."""

    def __init__(self, replicas: dict[str, int]) -> None:
        self.replicas = dict(replicas)
        self.ready = dict(replicas)
        self.auto_ready = True
        self.calls: list[tuple[str, str, str]] = []  # (verb, resource, content type)
        self.lock = threading.Lock()

    def deployment(self, ns: str, name: str) -> dict:
        labels = {"app": name}
        return {"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": self.replicas[name], "selector": {"matchLabels": labels},
                         "template": {"metadata": {"labels": labels}, "spec": {
                             "containers": [{"name": "worker", "image": "w"}]}}},
                "status": {"replicas": self.replicas[name],
                           "readyReplicas": self.ready[name]}}

    def scale(self, ns: str, name: str) -> dict:
        return {"apiVersion": "autoscaling/v1", "kind": "Scale",
                "metadata": {"name": name, "namespace": ns},
                "spec": {"replicas": self.replicas[name]},
                "status": {"replicas": self.ready[name]}}


@pytest.fixture
def fake() -> Iterator[tuple[FakeApps, str]]:
    apps = FakeApps({"pool-a": 3, "pool-b": 0, "pool-c": 0})

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, status: int, body: dict) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _route(self, verb: str) -> None:
            match = PATH.match(self.path.split("?")[0])
            if match is None or match.group(2) not in apps.replicas:
                self._answer(404, {"kind": "Status", "code": 404, "reason": "NotFound"})
                return
            ns, name, sub = match.groups()
            resource = "deployments/scale" if sub else "deployments"
            with apps.lock:
                apps.calls.append((verb, resource, self.headers.get("Content-Type", "")))
                if verb == "patch" and sub:
                    length = int(self.headers.get("Content-Length", 0))
                    body = json.loads(self.rfile.read(length))
                    apps.replicas[name] = int(body["spec"]["replicas"])
                    if apps.auto_ready:
                        apps.ready[name] = apps.replicas[name]
                    self._answer(200, apps.scale(ns, name))
                elif verb == "get" and not sub:
                    self._answer(200, apps.deployment(ns, name))
                else:
                    self._answer(405, {"kind": "Status", "code": 405})

        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self._route("get")

        def do_PATCH(self) -> None:  # noqa: N802
            self._route("patch")

        def log_message(self, *args: object) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield apps, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def controller(host: str, redis_url: str, min_workers: int = 1):
    from kubernetes import client

    from workers.fleet.k8s_controller import FleetController, Scaler

    configuration = client.Configuration()
    configuration.host = host
    apps = client.AppsV1Api(client.ApiClient(configuration))
    scaler = Scaler(apps, "specroute", {p: p for p in ("pool-a", "pool-b", "pool-c")})
    return FleetController(scaler, redis_url, "m", min_workers)


def publish(redis_url: str, desired: dict[str, int]) -> None:
    import redis

    redis.Redis.from_url(redis_url).set(
        desired_fleet_key("m"), FleetPlan("m", {}, desired, 1.0, 1.1, 2, "test").to_json())


def test_scales_one_move_at_a_time_and_waits_for_ready(fake, redis_url: str) -> None:
    apps, host = fake
    ctl = controller(host, redis_url)
    assert ctl.reconcile_once() == "idle"  # nothing published yet
    publish(redis_url, {"pool-a": 1, "pool-b": 2, "pool-c": 0})
    apps.auto_ready = False
    assert ctl.reconcile_once() == "moved"
    assert apps.replicas == {"pool-a": 2, "pool-b": 1, "pool-c": 0}
    assert ctl.reconcile_once() == "waiting"  # pool-b's new pod is not ready
    apps.ready.update(apps.replicas)
    assert ctl.reconcile_once() == "moved"
    assert apps.replicas == {"pool-a": 1, "pool-b": 2, "pool-c": 0}
    apps.ready.update(apps.replicas)
    assert ctl.reconcile_once() == "idle"
    writes = [c for c in apps.calls if c[0] != "get"]
    assert len(writes) == 4
    assert all(resource == "deployments/scale" and "merge-patch+json" in content
               for _, resource, content in writes)
    ctl.close()


def test_never_below_the_minimum(fake, redis_url: str) -> None:
    apps, host = fake
    apps.replicas.update({"pool-a": 1})
    apps.ready.update({"pool-a": 1})
    ctl = controller(host, redis_url, min_workers=1)
    publish(redis_url, {"pool-a": 0, "pool-b": 1, "pool-c": 0})
    assert ctl.reconcile_once() == "held"
    assert apps.replicas["pool-a"] == 1
    ctl.close()


def test_rbac_grants_exactly_what_the_controller_calls(fake, redis_url: str) -> None:
    apps, host = fake
    ctl = controller(host, redis_url)
    publish(redis_url, {"pool-a": 2, "pool-b": 1, "pool-c": 0})
    assert ctl.reconcile_once() == "moved"
    ctl.close()
    used = {(verb, resource) for verb, resource, _ in apps.calls}
    docs = list(yaml.safe_load_all((ROOT / "deploy/k8s/fleet-controller.yaml").read_text()))
    [role] = [d for d in docs if d["kind"] == "Role"]
    granted = {(verb, resource) for rule in role["rules"] for resource in rule["resources"]
               for verb in rule["verbs"]}
    assert all(rule["apiGroups"] == ["apps"] for rule in role["rules"])
    assert granted == used == {("get", "deployments"), ("patch", "deployments/scale")}
    [binding] = [d for d in docs if d["kind"] == "RoleBinding"]
    [account] = [d for d in docs if d["kind"] == "ServiceAccount"]
    [deployment] = [d for d in docs if d["kind"] == "Deployment"]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]
    spec = deployment["spec"]["template"]["spec"]
    assert spec["serviceAccountName"] == account["metadata"]["name"]
    assert spec["containers"][0]["args"][0] == "fleet-controller"
    pools = {rule_name for rule in role["rules"] for rule_name in rule["resourceNames"]}
    workers = yaml.safe_load_all((ROOT / "deploy/k8s/sglang-workers.yaml").read_text())
    assert pools == {d["metadata"]["name"] for d in workers if d["kind"] == "Deployment"}
