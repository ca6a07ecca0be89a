"""The Starlette routes beside the token routes, where speed does not matter: models,
liveness and readiness, Prometheus metrics, the fleet plan and the OpenAPI document."""

from __future__ import annotations

import asyncio
import time

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.requests import Request
from starlette.responses import Response

from gateway.core.planning import FleetPlanning
from gateway.errors import AuthenticationFailed, ModelNotFound
from gateway.http.gateway import Gateway
from gateway.tenants.auth import is_admin


def json_response(body: object, status: int = 200) -> Response:
    return Response(orjson.dumps(body), status_code=status, media_type="application/json")


def _gateway(request: Request) -> Gateway:
    return request.app.state.gateway


def model_card(name: str, created: int) -> dict:
    return {"id": name, "object": "model", "created": created, "owned_by": "specroute"}


async def list_models(request: Request) -> Response:
    gateway = _gateway(request)
    tenant = gateway.auth.tenant(request.headers.get("authorization"))
    request.scope["specroute.tenant"] = tenant.name
    created = request.app.state.started
    models = [m for m in gateway.config.models if not tenant.models or m in tenant.models]
    return json_response({"object": "list", "data": [model_card(m, created) for m in models]})


async def get_model(request: Request) -> Response:
    gateway = _gateway(request)
    tenant = gateway.auth.tenant(request.headers.get("authorization"))
    request.scope["specroute.tenant"] = tenant.name
    name = request.path_params["model"]
    if name not in gateway.config.models or (tenant.models and name not in tenant.models):
        raise ModelNotFound(f"The model '{name}' does not exist", param="model",
                            code="model_not_found")
    return json_response(model_card(name, request.app.state.started))


async def health(request: Request) -> Response:
    return json_response({"status": "ok"})


async def ready(request: Request) -> Response:
    """200 while some configured model has a healthy worker: one model's open breakers
    must not take the replica out of the Service for every other model (the readiness
    probe). Which models can be served, by name; workers per model, pools and worker
    URLs only for an admin (`is_admin`)."""
    gateway = _gateway(request)
    models: dict[str, int] = dict.fromkeys(gateway.config.models, 0)
    for pool in gateway.pools.values():  # a pool on its last resort is not ready
        models[pool.config.model] += pool.up_workers
    servable = {model: up > 0 for model, up in models.items()}
    is_ready = any(servable.values())
    status = 200 if is_ready else 503
    if not is_admin(request):
        return json_response({"ready": is_ready, "models_ready": servable}, status)
    now = time.monotonic()
    pools = {p.name: {"healthy_workers": p.healthy_workers, "workers": len(p.workers),
                      "last_resort": p.in_panic(now), "outstanding": p.outstanding,
                      "worker_states": [w.state(now) for w in p.workers]}
             for p in gateway.pools.values()}
    return json_response({"ready": is_ready, "models_ready": servable, "models": models,
                          "pools": pools}, status)


async def metrics(request: Request) -> Response:
    """Open unless an admin key is configured (a Prometheus in the same network scrapes
    it without one); then only for that key."""
    if _gateway(request).config.server.admin_api_key_sha256 is not None \
            and not is_admin(request):
        raise AuthenticationFailed("/metrics needs the admin key: send 'Authorization: "
                                   "Bearer <admin key>'", code="invalid_api_key")
    request.app.http_metrics.update(_gateway(request).pools)
    return Response(generate_latest(request.app.state.registry), media_type=CONTENT_TYPE_LATEST)


async def routing_fleet(request: Request) -> Response:
    """The fleet planner's current vs desired workers per pool, predicted gain and reason,
    per model (planned now if it has not planned yet); admin only (`is_admin`)."""
    if not is_admin(request):
        raise AuthenticationFailed("/v1/routing/fleet needs the admin key: send "
                                   "'Authorization: Bearer <admin key>'", code="invalid_api_key")
    planning: FleetPlanning | None = request.app.state.planning
    if planning is None:
        return json_response({"planner": "off (it needs redis_url and the learned policy)",
                              "models": {}})
    if planning.planned_at is None:
        await asyncio.to_thread(planning.plan_all)
    return json_response({"planner": "on", **planning.report()})


async def openapi_json(request: Request) -> Response:
    """The gateway's OpenAPI document (`gateway.http.openapi`), for clients and fuzzers."""
    return Response(request.app.state.openapi, media_type="application/json")
