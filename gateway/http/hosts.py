"""The `Host` allowlist: an ASGI wrapper that answers 421 to a request naming a host the
gateway does not serve (`server.allowed_hosts`).

Why: a gateway on 127.0.0.1 is reachable from any web page the machine's browser opens.
With DNS rebinding (a name of the attacker's that first resolves to their server, then
to 127.0.0.1) that page's scripts pass the browser's same-origin check and read the
answers — the console, `/ready`'s detail, completions on the user's keys. The one thing
the page cannot change is the `Host` header: it names the attacker's domain. So only the
names the operator lists pass: by default the loopback names, which no rebinding can
produce. Entries are host names or addresses (no port; matched without case), a
`*.example.com` suffix pattern, or `*` for any host (a gateway behind a load balancer
or in a cluster, where probes name the pod's IP).

Wrap the app the server runs: `HostAllowlist(app, config.server.allowed_hosts)`; other
ASGI scopes (lifespan) pass through untouched.
"""

from __future__ import annotations

from collections.abc import Iterable

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.errors import MisdirectedRequest, error_body


def host_name(value: str) -> str:
    """The host of a `Host` header without its port: `[::1]:8000` -> `::1`."""
    value = value.strip().lower()
    if value.startswith("["):
        return value[1:value.find("]")] if "]" in value else ""
    return value.rsplit(":", 1)[0] if value.count(":") == 1 else value


class HostAllowlist:
    """Answer 421 (`MisdirectedRequest`, `code: host_not_allowed`) to an HTTP request whose
    `Host` is missing or not in `allowed`; pass everything else to `app`."""

    def __init__(self, app: ASGIApp, allowed: Iterable[str]) -> None:
        self.app = app
        entries = {entry.strip().lower() for entry in allowed}
        self.any = "*" in entries
        self.suffixes = tuple(entry[1:] for entry in entries if entry.startswith("*."))
        self.names = frozenset(entry for entry in entries if not entry.startswith("*"))

    def allows(self, host: str) -> bool:
        return self.any or host in self.names or any(host.endswith(s) for s in self.suffixes)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket") or self.any:
            await self.app(scope, receive, send)
            return
        raw = next((v for k, v in scope["headers"] if k == b"host"), b"")
        host = host_name(raw.decode("latin-1"))
        if self.allows(host):
            await self.app(scope, receive, send)
            return
        if scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1008})
            return
        error = MisdirectedRequest(f"this gateway does not serve the host {host!r}; its "
                                   f"server.allowed_hosts lists the names it answers to",
                                   param="host", code="host_not_allowed")
        body = error_body(error)
        await send({"type": "http.response.start", "status": error.status,
                    "headers": [(b"content-type", b"application/json"),
                                (b"content-length", str(len(body)).encode()),
                                (b"connection", b"close")]})
        await send({"type": "http.response.body", "body": body})
