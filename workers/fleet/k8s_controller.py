"""Kubernetes mode of the fleet planner: the cluster moves the workers.

Where the fleet runs as one Deployment per pool (deploy/k8s: Deployment name = pool
name), this controller applies the desired fleet that the gateway publishes in Redis
(`policies.fleet.desired_fleet_key`) by scaling those Deployments through the Kubernetes
API (`deployments/scale`, the only write its RBAC allows: deploy/k8s/fleet-controller.yaml).
Pods never move themselves: a pod of the shrinking pool is terminated (its supervisor
drains on SIGTERM) and one of the growing pool is scheduled on the freed GPU.

One move at a time, as with supervisors: nothing is changed while any of the model's
Deployments has fewer ready replicas than it asks for (a move under way, or a pod not up);
then the planner's next move (`policies.planner.next_move`) scales the source down by one
and the destination up by one. Never below `min_workers` replicas for the model. A
Deployment that never gets ready is visible as 'waiting' and in the cluster's own events;
the controller does not roll back on its own (the planner sees the missing worker and
re-plans).

`Scaler` wraps the official `kubernetes` client's `AppsV1Api`
(`read_namespaced_deployment`, `patch_namespaced_deployment_scale`); the `kubernetes`
package is the `k8s` extra, imported only when the controller runs.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from policies.keys import desired_fleet_key
from policies.planner import FleetPlan, next_move

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Replicas:
    wanted: int  # spec.replicas
    ready: int  # status.readyReplicas


class Scaler:
    """The model's pool Deployments in one namespace, through `AppsV1Api`."""

    def __init__(self, apps: Any, namespace: str, deployments: Mapping[str, str]) -> None:
        self.apps = apps  # kubernetes.client.AppsV1Api
        self.namespace = namespace
        self.deployments = dict(deployments)  # pool -> Deployment name

    def replicas(self) -> dict[str, Replicas]:
        out = {}
        for pool, name in self.deployments.items():
            deployment = self.apps.read_namespaced_deployment(name, self.namespace)
            out[pool] = Replicas(int(deployment.spec.replicas or 0),
                                 int(deployment.status.ready_replicas or 0))
        return out

    def scale(self, pool: str, replicas: int) -> None:
        self.apps.patch_namespaced_deployment_scale(
            self.deployments[pool], self.namespace, {"spec": {"replicas": replicas}})


class FleetController:
    def __init__(self, scaler: Scaler, redis_url: str, model: str,
                 min_workers: int = 1) -> None:
        self.scaler = scaler
        self.model = model
        self.min_workers = min_workers
        self._redis = redis.Redis.from_url(redis_url, socket_timeout=5.0)
        self.moves = 0

    def desired(self) -> dict[str, int] | None:
        raw = self._redis.get(desired_fleet_key(self.model))
        if not raw:
            return None
        wanted = FleetPlan.from_json(raw).desired  # type: ignore[arg-type]
        return {pool: int(wanted.get(pool, 0)) for pool in self.scaler.deployments}

    def reconcile_once(self) -> str:
        """'moved', 'waiting' (a Deployment not ready), 'held' (minimum), or 'idle'."""
        try:
            desired = self.desired()
        except (redis.RedisError, ValueError, TypeError) as exc:
            logger.warning("cannot read the desired fleet of %s: %s", self.model, exc)
            return "idle"
        if desired is None:
            return "idle"
        replicas = self.scaler.replicas()
        if any(r.ready < r.wanted for r in replicas.values()):
            return "waiting"
        current = {pool: r.wanted for pool, r in replicas.items()}
        move = next_move(current, desired)
        if move is None:
            return "idle"
        if sum(current.values()) - 1 < self.min_workers:
            return "held"
        src, dst = move
        logger.info("moving one worker of %s: %s -> %s", self.model, src, dst)
        self.scaler.scale(src, current[src] - 1)  # frees the GPU first
        self.scaler.scale(dst, current[dst] + 1)
        self.moves += 1
        return "moved"

    def close(self) -> None:
        self._redis.close()


def run_controller(config_path: str, model: str, namespace: str, redis_url: str | None,
                   min_workers: int, interval_s: float,
                   stopping: threading.Event | None = None) -> int:
    """Blocking loop of `specroute fleet-controller` (in-cluster credentials, else the
    local kubeconfig)."""
    import os

    from kubernetes import client, config

    from workers.fleet.member import model_pools

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    try:
        config.load_incluster_config()
    except config.ConfigException:
        config.load_kube_config()
    pools = model_pools(config_path, model)
    url = redis_url or os.environ.get("REDIS_URL")
    if url is None:
        raise SystemExit("no Redis: pass --redis-url or set REDIS_URL")
    scaler = Scaler(client.AppsV1Api(), namespace, {name: name for name in pools})
    controller = FleetController(scaler, url, model, min_workers)
    stopping = stopping or threading.Event()
    try:
        while not stopping.wait(interval_s):
            try:
                controller.reconcile_once()
            except client.ApiException as exc:
                logger.warning("Kubernetes API: %s %s", exc.status, exc.reason)
    finally:
        controller.close()
    return 0
