"""Tenants: who is calling (API key -> tenant), what they may ask for, and reloading them.

Keys live in the config only as hex sha256 digests (`specroute keys add` prints a new key
once and writes its digest). With no tenants configured the gateway runs every request as
tenant "default", and `check_exposure` refuses to serve that open gateway on a
non-loopback address unless the operator wrote `auth: none`. A tenant's `models`,
`max_tokens` and `may_pin` are enforced by `authorize` before routing.

Tenants reload without a restart: `TenantReloader` re-reads the config (and its
`tenants_file`) when either file changes or on SIGHUP, and swaps in a new
`Authenticator`; a request in flight keeps the `TenantConfig` it was admitted with.
A file that fails to parse is logged and the tenants already loaded stay; so do they when
the new file lists none (that would open a gateway that checks keys: restart for that).
Only tenants and `auth` are taken from a reload; other changes need a restart.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
import signal
from collections.abc import Callable
from pathlib import Path

import yaml
from starlette.requests import Request
from starlette.types import Scope

from gateway.config import (
    ConfigError,
    GatewayConfig,
    TenantConfig,
    hash_api_key,
    load_config,
)
from gateway.errors import AuthenticationFailed, InvalidRequest, ModelNotFound, PermissionDenied
from gateway.periodic import Periodic
from gateway.pins import Pin
from gateway.schemas import GenerationRequest

log = logging.getLogger("specroute.gateway")

# Without tenants everyone is "default"; it may pin (the open gateway is loopback-only
# or `auth: none`, both the operator's own choice).
DEFAULT_TENANT = TenantConfig(name="default", may_pin=True)


class Authenticator:
    def __init__(self, tenants: tuple[TenantConfig, ...], auth: str = "keys") -> None:
        self.required = auth == "keys" and bool(tenants)
        self.by_hash = {h: t for t in tenants for h in t.api_key_sha256}
        self.by_name = {t.name: t for t in tenants}
        # Keys already proven, to their tenant: a request with a known key skips the
        # digest (hashlib's call, the hex string: a few µs of each request's CPU). Only a
        # key whose digest matched is kept, so it holds at most the configured keys (a
        # caller sending random keys adds nothing); a reload builds a new Authenticator,
        # so a removed key is forgotten with it.
        self.proven: dict[str, TenantConfig] = {}

    def tenant(self, authorization: str | None) -> TenantConfig:
        """The tenant for an `Authorization` header value; raises 401 when unknown."""
        if not self.required:
            return DEFAULT_TENANT
        if not authorization or authorization[:7].lower() != "bearer ":  # RFC 9110 11.1
            raise AuthenticationFailed(
                "Missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        key = authorization[7:].strip()
        tenant = self.proven.get(key)
        if tenant is not None:
            return tenant
        tenant = self.by_hash.get(hash_api_key(key))
        if tenant is None:
            raise AuthenticationFailed("Incorrect API key provided", code="invalid_api_key")
        if len(self.proven) < len(self.by_hash):
            self.proven[key] = tenant
        return tenant

    def named(self, name: str) -> TenantConfig:
        """The tenant called `name` (the SLO-aware policy looks tenants up by name)."""
        return self.by_name.get(name, DEFAULT_TENANT)


def is_loopback_host(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:  # a host name: it may resolve to anything
        return False


def check_exposure(config: GatewayConfig, host: str) -> str | None:
    """Why the gateway must not start on `host`, or None. No tenants means no
    authentication; that is refused on any non-loopback address unless `auth: none`."""
    if config.tenants or config.auth == "none" or is_loopback_host(host):
        return None
    return (f"refusing to listen on {host} with no tenants configured: anyone who can "
            f"reach it could use it. Add tenants (`specroute keys add TENANT --config "
            f"FILE`), bind 127.0.0.1, or set `auth: none` to run it open on purpose")


def authorize(tenant: TenantConfig, request: GenerationRequest, pin: Pin) -> None:
    """The tenant's own limits on what it asks for; a request without `max_tokens` gets
    the tenant's cap as its `max_tokens` (a worker would otherwise run to its context),
    which the adapters write into the body they send (native `/generate` included)."""
    if tenant.models and request.model not in tenant.models:
        # OpenAI's wording: a model one may not use reads as one that does not exist
        raise ModelNotFound(f"The model '{request.model}' does not exist or you do not "
                            f"have access to it", param="model", code="model_not_found")
    if (pin.pool is not None or pin.k is not None) and not tenant.may_pin:
        which = "x-specroute-pool" if pin.pool is not None else "x-specroute-k"
        raise PermissionDenied(f"tenant '{tenant.name}' may not pin a pool or k ({which})",
                               param=which, code="pin_not_allowed")
    cap = tenant.max_tokens
    if not cap:
        return
    if request.max_tokens is None:
        request.max_tokens = cap
        request.body = {**request.body, "max_tokens": cap}
    elif request.max_tokens > cap:
        field = "max_tokens" if request.native is None else "sampling_params.max_new_tokens"
        raise InvalidRequest(f"{field} {request.max_tokens} is above this key's cap of "
                             f"{cap}", param=field, code="max_tokens_exceeded")


class TenantReloader:
    """Re-reads the tenants when the config file or its `tenants_file` changes (polled
    every `interval_s`) or on SIGHUP, and hands the new `Authenticator` to `install`."""

    def __init__(self, config_path: str | Path, install: Callable[[Authenticator], None],
                 required: bool, interval_s: float = 1.0) -> None:
        self.path = Path(config_path)
        self.current_required = required  # keys are checked now: never reload to open
        self.install = install
        self.seen = self._stamps()
        self.loop = Periodic("tenant-reload", self._tick, interval_s)
        self.pending: set[asyncio.Task] = set()
        self.reloads = 0

    def _files(self) -> list[Path]:
        files = [self.path]
        try:
            raw = yaml.safe_load(self.path.read_text())
        except (OSError, yaml.YAMLError):  # mid-edit or gone: the stamp says it changed
            return files
        if isinstance(raw, dict) and isinstance(raw.get("tenants_file"), str):
            files.append(self.path.parent / raw["tenants_file"])
        return files

    def _stamps(self) -> tuple:
        stamps: list[tuple] = []
        for path in self._files():
            try:
                st = path.stat()
                stamps.append((str(path), st.st_mtime_ns, st.st_size, st.st_ino))
            except OSError:
                stamps.append((str(path), None))
        return tuple(stamps)

    async def _tick(self) -> None:
        try:
            stamps = await asyncio.to_thread(self._stamps)
            if stamps != self.seen:
                self.seen = stamps
                await self.reload()
        except Exception:  # noqa: BLE001 - a tick that raises would end the watching
            log.exception("tenant reload check failed; still watching")

    async def reload(self) -> bool:
        """Load the tenants now; False (and the old tenants kept) when the file is bad."""
        try:
            config = await asyncio.to_thread(load_config, self.path)
        except ConfigError as exc:
            log.error("tenants not reloaded, keeping the current ones: %s", exc)
            return False
        if self.current_required and not config.tenants:
            log.error("tenants not reloaded: %s lists none, which would open the gateway; "
                      "restart it to run without tenants", self.path)
            return False
        auth = Authenticator(config.tenants, config.auth)
        self.current_required = auth.required
        self.install(auth)
        self.reloads += 1
        log.info("tenants reloaded from %s: %d tenant(s)", self.path, len(config.tenants))
        return True

    def _sighup(self) -> None:
        task = asyncio.get_running_loop().create_task(self.reload())
        self.pending.add(task)  # held until done: the loop keeps only a weak reference
        task.add_done_callback(self.pending.discard)

    def start(self) -> None:
        self.loop.start(wait_first=True)
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, self._sighup)

    async def stop(self) -> None:
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
            asyncio.get_running_loop().remove_signal_handler(signal.SIGHUP)
        await self.loop.stop()


def is_loopback(scope: Scope) -> bool:
    """The connection arrived on a loopback address (a bind to 127.0.0.1, or a local
    caller of a wildcard bind)."""
    server = scope.get("server")
    try:
        return server is not None and ipaddress.ip_address(server[0]).is_loopback
    except ValueError:  # a unix socket path
        return False


def is_admin(request: Request) -> bool:
    """The caller may see operator detail: it sent `server.admin_api_key_sha256`'s key as
    a Bearer token, or, with no admin key configured and `server.loopback_admin` set (as
    `specroute up` does: one user's machine), it called over loopback. Without either,
    nobody is: any local process or user, or a page that reached the port, is not the
    operator by its address alone."""
    server = request.app.state.gateway.config.server
    digest = server.admin_api_key_sha256
    if digest is None:
        return server.loopback_admin and is_loopback(request.scope)
    header = request.headers.get("authorization", "")
    if header[:7].lower() != "bearer ":
        return False
    return hmac.compare_digest(hash_api_key(header[7:].strip()), digest.lower())
