"""The operator console: `GET /console` (a page and its script, served from
`gateway/http/static/`, nothing from elsewhere) and `GET /v1/console/state` (the JSON
it polls, `gateway.http.console_state`).

Who may look: the admin (`gateway.tenants.auth.is_admin`: the admin key as a Bearer
token, or, with `server.loopback_admin` set (`specroute up` does), a connection to a
loopback address while no admin key is configured, as for
`/v1/routing/fleet`). A browser cannot send a Bearer header when it opens a page, so the
admin key is also taken as the password of HTTP Basic authentication (RFC 7617; any user
name): without it the answer is a 401 with a `Basic` challenge, the browser asks, then
sends the credentials with the page's own requests too. Without an admin key, a
connection to any other address gets a 403.

`Console` is built in the app lifespan. Its loop (every `refresh_s`, on the event loop)
closes the recent traffic's sample interval when due and re-reads, in a thread, what
only Redis knows: the k each registered worker runs (`workers.fleet.registry`), each
pool's desired k (`policies.fleet.desired_k_key`) and the worker a supervisor is moving
(`policies.fleet.fleet_move_key`). A Redis failure keeps the last facts and says so.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hmac
import json
import logging
import time
from importlib import resources

import orjson
import redis
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response

from gateway.config import hash_api_key
from gateway.core.planning import FleetPlanning
from gateway.errors import AuthenticationFailed, PermissionDenied, error_response
from gateway.http.console_state import ConsoleSources, RegistryFacts, console_state
from gateway.http.gateway import Gateway
from gateway.periodic import Periodic
from gateway.tenants.auth import is_admin
from policies.keys import desired_k_key, fleet_move_key, pool_workers_key, worker_key
from workers.fleet.registry import WorkerInfo

log = logging.getLogger("specroute.gateway")
REALM = 'Basic realm="specroute console", charset="UTF-8"'
ASSETS = {"console.js": "text/javascript; charset=utf-8",
          "console.css": "text/css; charset=utf-8"}
# everything from the gateway itself; the SVG plots are drawn through the DOM
PAGE_HEADERS = {"content-security-policy": "default-src 'none'; script-src 'self'; "
                "style-src 'self'; connect-src 'self'; img-src 'self' data:; "
                "base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
                "cache-control": "no-store", "x-content-type-options": "nosniff",
                "referrer-policy": "no-referrer"}


def _asset(name: str) -> bytes:
    return resources.files("gateway.http").joinpath("static", name).read_bytes()


def basic_password(header: str | None) -> str | None:
    """The password of an `Authorization: Basic` header; None if it is not one."""
    if not header or header[:6].lower() != "basic ":
        return None
    try:
        decoded = base64.b64decode(header[6:].strip(), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        return None
    _, colon, password = decoded.partition(":")
    return password if colon else None


def console_refusal(request: Request) -> Response | None:
    """None when the caller may see the console, else the answer to give it."""
    if is_admin(request):
        return None
    digest = request.app.state.gateway.config.server.admin_api_key_sha256
    if digest is None:
        return error_response(PermissionDenied(
            "with no admin key (server.admin_api_key_sha256) the console answers only on a "
            "loopback address, and only with server.loopback_admin", code="admin_only"))
    password = basic_password(request.headers.get("authorization"))
    if password is not None and hmac.compare_digest(hash_api_key(password), digest.lower()):
        return None
    return error_response(AuthenticationFailed(
        "the console needs the admin key: 'Authorization: Bearer <admin key>', or as the "
        "password of HTTP Basic authentication", code="invalid_api_key"),
        {"www-authenticate": REALM})


class Console:
    def __init__(self, gateway: Gateway, planning: FleetPlanning | None,
                 prior_sources: dict[str, str], refresh_s: float = 2.0) -> None:
        self.gateway = gateway
        self.routing = gateway.policy
        self.planning = planning
        self.recent = gateway.recent
        self.tenant_metrics = gateway.tenant_metrics
        self.prior_sources = prior_sources
        self.registry = RegistryFacts()
        self.started = time.time()
        url = gateway.config.redis_url
        self.client = redis.Redis.from_url(url, socket_timeout=1.0,
                                           socket_connect_timeout=1.0) if url else None
        self.page = _asset("console.html")
        self.assets = {name: _asset(name) for name in ASSETS}
        self._loop = Periodic("specroute-console", self.tick, refresh_s)

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
        if self.client is not None:
            self.client.close()

    async def tick(self) -> None:
        if self.recent.due():
            self.recent.sample()
        if self.client is not None:
            try:
                self.registry = await asyncio.to_thread(self.read_registry)
            except (redis.RedisError, OSError, ValueError, KeyError, TypeError) as exc:
                # a tick that raises would end the loop; a malformed entry is a fact to show
                self.registry = RegistryFacts(
                    self.registry.running_k, self.registry.desired_k, self.registry.moving,
                    self.registry.read_at, f"{type(exc).__name__}: {exc}")

    def read_registry(self) -> RegistryFacts:
        """Blocking Redis reads (a thread): a few keys per pool and per model."""
        assert self.client is not None
        running: dict[str, dict[str, int]] = {}
        desired: dict[str, int] = {}
        for name in self.gateway.pools:
            urls = sorted(u.decode() if isinstance(u, bytes) else u
                          for u in self.client.smembers(pool_workers_key(name)))
            infos = self.client.mget([worker_key(name, u) for u in urls]) if urls else []
            running[name] = {info.url.rstrip("/"): info.k
                             for info in (WorkerInfo.from_json(raw) for raw in infos
                                          if raw is not None)}
            raw_k = self.client.get(desired_k_key(name))
            if raw_k is not None:
                desired[name] = int(raw_k)
        moving = {}
        for model in self.gateway.config.models:
            raw = self.client.get(fleet_move_key(model))
            if raw:
                entry = json.loads(raw)
                if isinstance(entry, dict):
                    moving[model] = entry
        return RegistryFacts(running, desired, moving, time.time())

    def state(self) -> dict:
        return console_state(ConsoleSources(
            gateway=self.gateway, routing=self.routing, planning=self.planning,
            recent=self.recent, tenant_metrics=self.tenant_metrics,
            prior_sources=self.prior_sources, registry=self.registry, started=self.started))


def _console(request: Request) -> Console:
    return request.app.state.console


async def console_page(request: Request) -> Response:
    refusal = console_refusal(request)
    if refusal is not None:
        return refusal
    return Response(_console(request).page, media_type="text/html; charset=utf-8",
                    headers=PAGE_HEADERS)


async def console_asset(request: Request) -> Response:
    """The page's script and style sheet (no data in them: served to anyone)."""
    name = request.path_params["asset"]
    if name not in ASSETS:
        raise HTTPException(404, f"no console asset named {name[:100]!r}")
    return Response(_console(request).assets[name], media_type=ASSETS[name],
                    headers={"cache-control": "no-cache", "x-content-type-options": "nosniff"})


async def console_state_json(request: Request) -> Response:
    refusal = console_refusal(request)
    if refusal is not None:
        return refusal
    return Response(orjson.dumps(_console(request).state()), media_type="application/json",
                    headers={"cache-control": "no-store"})

