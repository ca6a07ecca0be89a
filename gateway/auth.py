"""Tenants: who is calling (API key → tenant) and whether they may call now.

Keys are stored as hex sha256 digests in the config, never in clear. With no tenants
configured the gateway is open and everything runs as tenant "default". Rate limits
here are per gateway process (a fixed one-minute window); the Redis-backed limiter
shared by all replicas replaces `RateLimiter` behind the same `admit` call.
"""

from __future__ import annotations

import time

from gateway.config import TenantConfig, hash_api_key
from gateway.errors import AuthenticationFailed, RateLimited

DEFAULT_TENANT = TenantConfig(name="default")


class Authenticator:
    def __init__(self, tenants: tuple[TenantConfig, ...]) -> None:
        self.required = bool(tenants)
        self.by_hash = {h: t for t in tenants for h in t.api_key_sha256}

    def tenant(self, authorization: str | None) -> TenantConfig:
        """The tenant for an `Authorization` header value; raises 401 when unknown."""
        if not self.required:
            return DEFAULT_TENANT
        if not authorization or authorization[:7].lower() != "bearer ":  # RFC 9110 11.1
            raise AuthenticationFailed(
                "Missing API key: send 'Authorization: Bearer <key>'", code="invalid_api_key")
        digest = hash_api_key(authorization[7:].strip())
        tenant = self.by_hash.get(digest)
        if tenant is None:
            raise AuthenticationFailed("Incorrect API key provided", code="invalid_api_key")
        return tenant


class RateLimiter:
    """Requests per minute per tenant, counted in fixed 60 s windows."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[int, int]] = {}  # tenant → (window start minute, count)

    def admit(self, tenant: TenantConfig, now: float | None = None) -> None:
        if tenant.rate_limit_rpm <= 0:
            return
        minute = int((time.time() if now is None else now) // 60)
        start, count = self.windows.get(tenant.name, (minute, 0))
        if start != minute:
            count = 0
        if count >= tenant.rate_limit_rpm:
            raise RateLimited(f"Rate limit of {tenant.rate_limit_rpm} requests per minute "
                              f"reached for tenant '{tenant.name}'", code="rate_limit_exceeded")
        self.windows[tenant.name] = (minute, count + 1)
