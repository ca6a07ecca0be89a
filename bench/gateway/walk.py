"""The walk of one chat request through the gateway's packages, from the endpoint to the
worker and back to the record.

Every Python call event of the project's code during one request (`sys.setprofile`:
calls, and coroutines resumed when an await completes) is put in its area: a gateway
subpackage (`gateway/http`, `gateway/core`, `gateway/routing`, ...), `policies` or
`workers`. The gateway's ground modules (config, schemas, pools, errors, pins) and
`gateway/telemetry` (spans and metrics that every layer touches) are leaves and left
out. The deadline clock's tick (`gateway/http/deadlines.py` `Clock._tick`, a loop timer
every 10 ms while any deadline of any request is armed) is the loop's housekeeping, not
a call of the request, and is left out too, with what runs inside it. The walk is
the sequence of areas with repeats collapsed; its crossings are its length less one.
Deterministic for a given tree: the same request, warm, one at a time.

    python -m bench.gateway.walk             # the walk of a chat request, area by area
"""

from __future__ import annotations

import argparse
import asyncio
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import httpx
import orjson

from bench.gateway.hot_path import Lifespan, post
from gateway.config import parse_config
from gateway.http.app import create_app

ROOT = Path(__file__).resolve().parents[2]
LEAVES = frozenset({"gateway", "gateway/telemetry"})
HOUSEKEEPING = frozenset({"deadlines.py:_tick"})  # left out with every call inside them
BODY = orjson.dumps({"model": "bench", "max_tokens": 8,
                     "messages": [{"role": "user", "content": "hello"}]})


@dataclass(frozen=True, slots=True)
class Stay:
    area: str
    first_call: str  # `module.py:function` that entered the area


def area_of(filename: str, root: Path = ROOT) -> str | None:
    """The area a source file belongs to; None outside the project's runtime packages."""
    try:
        parts = Path(filename).resolve().relative_to(root).parts
    except ValueError:
        return None
    if parts[0] == "gateway":
        return "gateway" if len(parts) == 2 else f"gateway/{parts[1]}"
    return parts[0] if parts[0] in ("policies", "workers") else None


def stays(calls: list[tuple[str, str]]) -> list[Stay]:
    """(area, `file:function`) call events, leaves dropped, repeats collapsed."""
    out: list[Stay] = []
    for area, where in calls:
        if area in LEAVES:
            continue
        if not out or out[-1].area != area:
            out.append(Stay(area, where))
    return out


async def walk(app, body: bytes = BODY) -> list[Stay]:  # noqa: ANN001 - any ASGI app
    """One request's stays (the app warm, earlier records reported)."""
    for _ in range(3):
        assert await post(app, body, "") == 200
    await asyncio.sleep(0.2)  # the warm-up requests' records reported
    calls: list[tuple[str, str]] = []
    inside: list[FrameType] = []  # the housekeeping call running, if any

    def profile(frame: FrameType, event: str, arg: object) -> None:
        if inside:
            if event == "return" and frame is inside[0]:
                inside.clear()
            return
        if event == "call" and (area := area_of(frame.f_code.co_filename)) is not None:
            where = f"{Path(frame.f_code.co_filename).name}:{frame.f_code.co_name}"
            if where in HOUSEKEEPING:
                inside.append(frame)
            else:
                calls.append((area, where))

    sys.setprofile(profile)
    try:
        status = await post(app, body, "")
        for _ in range(3):  # the record is reported on the loop's next turns
            await asyncio.sleep(0)
    finally:
        sys.setprofile(None)
    assert status == 200, status
    return stays(calls)


def upstream_config(url: str) -> dict:
    return {"pools": [{"name": "bench", "engine": "sglang", "model": "bench",
                       "method": "eagle", "k": 3, "workers": [url]}]}


async def measure(url: str) -> list[Stay]:
    """The walk through an app in this process, the learned policy, in front of `url`."""
    app = create_app(parse_config(upstream_config(url)))
    life = Lifespan(app)
    await life.start()
    try:
        pools = app.state.gateway.pools
        deadline = time.monotonic() + 30
        while not all(p.healthy_workers for p in pools.values()):  # the first probe
            if time.monotonic() > deadline:
                raise RuntimeError("the upstream never became healthy")
            await asyncio.sleep(0.05)
        return await walk(app)
    finally:
        await life.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, default=18931, help="the upstream's port")
    args = parser.parse_args(argv)
    url = f"http://127.0.0.1:{args.port}"
    upstream = subprocess.Popen([sys.executable, "-m", "bench.gateway.upstream",
                                 "--port", str(args.port)])
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(url + "/health", timeout=1.0)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        path = asyncio.run(measure(url))
    finally:
        upstream.terminate()
        upstream.wait(10)
    for stay in path:
        print(f"{stay.area:20} {stay.first_call}")
    print(f"crossings: {len(path) - 1}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
