"""What request headers may force or mark: a pool, a `k`, benchmark traffic.

Read by the routing core from `x-specroute-pool`, `x-specroute-k` and
`x-specroute-benchmark`; honoured by the router (`gateway.routing.router`), allowed per
tenant (`gateway.tenants.auth.authorize`: `may_pin`).
"""

from __future__ import annotations

from dataclasses import dataclass

from gateway.errors import InvalidRequest
from policies.request_limits import MAX_K


@dataclass(frozen=True, slots=True)
class Pin:
    """Routing forced (`x-specroute-pool`, `x-specroute-k`) or traffic marked
    (`x-specroute-benchmark`) by request headers; empty by default. Any of them makes the
    request a benchmark: its record is marked `pinned` and does not teach the policy."""

    pool: str | None = None
    k: int | None = None
    benchmark: bool = False

    @property
    def active(self) -> bool:
        return self.pool is not None or self.k is not None or self.benchmark

    @classmethod
    def from_headers(cls, pool: str | None, k: str | None,
                     benchmark: str | None = None) -> Pin:
        if pool is None and k is None and benchmark is None:
            return NO_PIN  # nearly every request: no headers, one shared empty pin
        return cls(pool=pool or None, k=None if k is None else parse_pinned_k(k),
                   benchmark=benchmark is not None and benchmark.strip() not in ("", "0"))

def parse_pinned_k(text: str) -> int:
    """ASCII digits only: `str.isdigit` accepts '²' or Arabic-Indic digits, which `int`
    then refuses or reads as another number."""
    value = text.strip(" \t")  # HTTP optional whitespace; not str.strip's Unicode set
    if not (value.isascii() and value.isdigit()) or int(value) > MAX_K:
        raise InvalidRequest(f"x-specroute-k must be an integer 0..{MAX_K}, "
                             f"got {text!r}", param="x-specroute-k", code="invalid_value")
    return int(value)

NO_PIN = Pin()  # a request without pins
