"""Worker URLs as the gateway's HTTP/1.1 client uses them (`gateway.upstream.http1`):
parsed once per URL into the connection pool's key and what each request writes."""

from __future__ import annotations

import functools
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Target:
    """Where a worker URL points: the connection's key, and what each request writes."""

    scheme: str
    host: str
    port: int
    prefix: str  # the URL's own path, which every request path follows
    authority: bytes  # the Host header's value


@functools.lru_cache(maxsize=1024)
def target(worker: str) -> Target:
    """Parse a worker URL (`http[s]://host[:port][/prefix]`) once."""
    scheme, _, rest = worker.partition("://")
    if scheme not in ("http", "https") or not rest:
        raise ValueError(f"not an http(s) URL: {worker!r}")
    authority, slash, prefix = rest.partition("/")
    host, port = authority, 443 if scheme == "https" else 80
    if authority.startswith("["):  # IPv6 literal
        close = authority.index("]")
        host = authority[1:close]
        if authority[close + 1:].startswith(":"):
            port = int(authority[close + 2:])
    elif ":" in authority:
        host, _, number = authority.rpartition(":")
        port = int(number)
    return Target(scheme, host, port, (slash + prefix).rstrip("/"), authority.encode())
