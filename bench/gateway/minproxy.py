"""The floor for any Python proxy on this machine: raw ASGI in, one HTTP client out.

    python -m bench.gateway.minproxy --port P --upstream URL [--client aiohttp|http1]

Forwards bodies unchanged and relays the answer (streamed as it comes), with no
parsing, routing or telemetry. `specroute bench gateway` runs it beside the gateway so
the table separates what the HTTP stack costs from what specroute adds: with aiohttp's
client (the yardstick the ratios use), and with the gateway's own upstream client
(`gateway.upstream.http1`, `--client http1`: the floor of the stack specroute runs on;
its answers are always labelled `application/json`).
"""

from __future__ import annotations

import argparse

import aiohttp

from bench.gateway.upstream import read_body


async def lifespan(receive, send, start, stop) -> None:  # noqa: ANN001
    """Run the ASGI lifespan: `start()` at startup, `await stop()` at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            start()
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await stop()
            await send({"type": "lifespan.shutdown.complete"})
            return


def make_http1_app(upstream: str):
    from gateway.upstream.http1 import Http1Client

    client = Http1Client(connect_s=5, read_s=300, total_s=600)

    async def stop() -> None:
        client.close()

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, lambda: None, stop)
            return
        body = await read_body(receive)
        resp = await client.request(scope["method"], upstream, scope["path"], body)
        try:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", b"application/json")]})
            while chunk := await resp.read_some():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})
        finally:
            resp.close()

    return app


def make_app(upstream: str):
    session: aiohttp.ClientSession | None = None

    def start() -> None:
        nonlocal session
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=256))

    async def stop() -> None:
        await session.close()

    async def app(scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send, start, stop)
            return
        body = await read_body(receive)
        async with session.request(scope["method"], upstream + scope["path"],
                                   data=body,
                                   headers={"content-type": "application/json"}) as resp:
            await send({"type": "http.response.start", "status": resp.status,
                        "headers": [(b"content-type", resp.content_type.encode())]})
            async for chunk in resp.content.iter_any():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b""})

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--upstream", required=True)
    parser.add_argument("--client", choices=("aiohttp", "http1"), default="aiohttp")
    args = parser.parse_args(argv)
    build = make_http1_app if args.client == "http1" else make_app
    uvicorn.run(build(args.upstream.rstrip("/")), host="127.0.0.1", port=args.port,
                loop="uvloop", http="httptools", log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
