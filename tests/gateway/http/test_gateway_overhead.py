"""The hot-path shortcuts keep behaviour: the token-route front door of `GatewayApp`,
and `DisconnectWatch` cancelling exactly the request that lost its client."""

from __future__ import annotations

import asyncio

import httpx
from starlette.exceptions import HTTPException
from starlette.routing import Route

from gateway.http.app import GatewayApp, http_error
from gateway.http.deadlines import Clock
from gateway.http.disconnect import DisconnectWatch


async def _fast(scope, receive, send) -> None:
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/plain")]})
    await send({"type": "http.response.body", "body": b"fast " + scope["app"].__class__.__name__.encode()})


async def test_token_route_front_door_and_405() -> None:
    app = GatewayApp(fast_routes={"/v1/completions": _fast},
                     routes=[Route("/v1/completions", _fast, methods=["POST"])],
                     exception_handlers={HTTPException: http_error})
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app),
                                 base_url="http://t") as client:
        ok = await client.post("/v1/completions", json={})
        assert ok.status_code == 200 and ok.text == "fast GatewayApp"
        wrong = await client.get("/v1/completions")
        assert wrong.status_code == 405
        assert wrong.json()["error"]["code"] == "method_not_allowed"
        missing = await client.post("/v1/nope")
        assert missing.status_code == 404


async def watched(receive, work_s: float, after_s: float = 0.0) -> str:  # noqa: ANN001
    """A request of `work_s` under a watch: how it ended."""
    watch = DisconnectWatch(receive, Clock(), after_s)
    try:
        await asyncio.sleep(work_s)
    except asyncio.CancelledError:
        assert watch.fired
        return "cancelled by client"
    finally:
        watch.close()
    return "finished"


async def test_disconnect_cancels_the_request_and_is_taken_back() -> None:
    left = asyncio.Event()

    async def receive() -> dict:
        await left.wait()
        return {"type": "http.disconnect"}

    task = asyncio.ensure_future(watched(receive, 30))
    await asyncio.sleep(0)
    left.set()
    assert await asyncio.wait_for(task, 5) == "cancelled by client"
    assert task.cancelling() == 0


async def test_disconnect_after_close_does_not_cancel() -> None:
    """uvicorn answers receive() with http.disconnect once the response is complete;
    that late message must not cancel the server's task."""
    message: asyncio.Future = asyncio.get_running_loop().create_future()

    async def receive() -> dict:
        return await message

    async def request() -> str:
        watch = DisconnectWatch(receive, Clock())
        await asyncio.sleep(0)  # the waiter is now parked in receive()
        message.set_result({"type": "http.disconnect"})
        await asyncio.sleep(0)  # the waiter completes; its callback is queued, not run
        watch.close()
        await asyncio.sleep(0.01)  # the queued callback runs here and must do nothing
        assert not watch.fired
        return "finished"

    assert await asyncio.wait_for(request(), 5) == "finished"


async def test_a_deferred_watch_waits_only_for_requests_still_running() -> None:
    """From `after_s` on: a request done before then never calls receive(); one still
    running then is cancelled by a disconnect its client sent earlier."""
    calls: list[str] = []

    async def gone() -> dict:
        calls.append("receive")
        return {"type": "http.disconnect"}

    assert await watched(gone, 0.01, after_s=0.05) == "finished"
    await asyncio.sleep(0.1)  # past after_s: the cancelled timer made no waiter
    assert calls == []
    task = asyncio.ensure_future(watched(gone, 30, after_s=0.05))
    assert await asyncio.wait_for(task, 5) == "cancelled by client"
    assert calls == ["receive"] and task.cancelling() == 0


async def test_a_part_that_hangs_at_shutdown_is_left_behind(monkeypatch, caplog) -> None:  # noqa: ANN001
    from gateway.core import services as app_module

    monkeypatch.setattr(app_module, "STOP_TIMEOUT_S", 0.05)
    stopped: list[str] = []

    async def hangs() -> None:
        await asyncio.Event().wait()

    async def quick() -> None:
        stopped.append("quick")

    await asyncio.wait_for(app_module.bounded_stop("stuck part", hangs), 5)
    await app_module.bounded_stop("quick part", quick)
    assert stopped == ["quick"]
    assert "stuck part did not stop within 0.05 s" in caplog.text
