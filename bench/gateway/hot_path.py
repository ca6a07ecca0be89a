"""CPU per request of each stage of the gateway's hot path, in-process.

    python -m bench.gateway.hot_path [--calls N] [--json] [--ablate | --profile]

Builds the gateway app in its production configuration (the `specroute bench gateway`
one: learned policy, a tenant with an API key, Redis telemetry on a redis-server of its
own) in front of `bench.gateway.upstream` (its own process), runs its lifespan, and
times each stage of one non-streaming "hello" chat request with the app's own objects,
on this thread's CPU clock (`time.thread_time_ns`), median of N calls: parse (orjson +
the typed request), authenticate, read request (the headers, authentication and the
body read, as the token routes do; not in the sum), classify, decide (route: capability
filter, the learned policy, the SLO hook), decide with every pool busy (as under load:
the SLO hook checks the pick against the tenant's SLO; not in the sum), admission (enter
+ leave), upstream call (the adapter's body, the upstream round trip, reading the
answer), relay (rendering the answer), record (the policy's record, the policy feed, the
telemetry enqueue, the trace) and metrics (Prometheus, tenant metrics, the
recent-traffic view, the HTTP answer counter). Then the whole request through the app's
ASGI entry (main thread), one at a time and 32 in flight (the pool busy, so the SLO
check runs: what `specroute bench gateway` loads at c32), and the threads' share (the
telemetry store's flush, the policy's refit) as process CPU less main-thread CPU over a
run of requests 8 at a time; last, a yardstick (`sum(range(5000))`, the mean of its
median before and after the rows) to compare runs on a shared machine by. The HTTP
server (uvicorn) is not in it: it is what the minimal proxy pays too (`specroute bench
gateway`).

`--ablate` measures the other way round: the whole request's CPU as the gateway's parts
are taken away one after another (record and metrics, classification, admission, the
decision), down to the minimal proxy's app on the same upstream client; each part's cost
is its row's drop, in the context of a whole request.

`--profile` runs cProfile over N whole requests sent 32 at a time and lists the functions
with the most own thread CPU time, per request (cProfile's own cost inflates Python calls against C
ones: shares to rank, not figures to add up).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import SimpleNamespace

import orjson

from bench.gateway import overhead as bench_gateway
from gateway.config import parse_config
from gateway.http.app import create_app
from gateway.http.endpoints import read_request
from gateway.http.responses import response_body
from gateway.pins import NO_PIN, Pin
from gateway.routing.admission import Ticket
from gateway.schemas import parse_request
from gateway.telemetry.record import Outcome, Timer, request_record
from workers.processes import free_port, start_redis

KEY = "sk-bench"
BODY = orjson.dumps({**bench_gateway.BODY, "stream": False})
# rows that overlap others, left out of the sum of stages
APART = ("read request (authenticated, body read)", "decide, pool busy")


def scope_for(body: bytes, key: str = KEY) -> dict:
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": "/v1/chat/completions",
            "raw_path": b"/v1/chat/completions", "query_string": b"", "root_path": "",
            "client": ("127.0.0.1", 50000), "server": ("127.0.0.1", 8000),
            "headers": [(b"host", b"gateway"), (b"content-type", b"application/json"),
                        (b"authorization", f"Bearer {key}".encode()),
                        (b"content-length", str(len(body)).encode())]}


async def post(app, body: bytes, key: str = KEY) -> int:  # noqa: ANN001 - any ASGI app
    """One request through the app's ASGI entry, with `key` as its bearer; its status."""
    sent, status = False, 0
    finished = asyncio.Event()

    async def receive() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await finished.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif not message.get("more_body", False):
            finished.set()

    await app(scope_for(body, key), receive, send)
    return status


class Lifespan:
    """Runs an ASGI app's lifespan: `await start()`, then `await stop()`."""

    def __init__(self, app) -> None:  # noqa: ANN001
        self.app = app
        self.events: asyncio.Queue = asyncio.Queue()
        self.done: asyncio.Queue = asyncio.Queue()
        self.task: asyncio.Task | None = None

    async def start(self, ready: bool = True) -> None:
        async def receive() -> dict:
            return await self.events.get()

        async def send(message: dict) -> None:
            await self.done.put(message["type"])

        self.task = asyncio.ensure_future(self.app(
            {"type": "lifespan", "asgi": {"version": "3.0"}, "state": {}}, receive, send))
        await self.events.put({"type": "lifespan.startup"})
        answer = await asyncio.wait_for(self.done.get(), 60)
        if answer != "lifespan.startup.complete":
            raise RuntimeError(f"the app did not start: {answer}")
        if not ready:
            return
        pools = self.app.state.gateway.pools
        deadline = time.monotonic() + 30
        while not all(p.healthy_workers for p in pools.values()):  # the first health probe
            if time.monotonic() > deadline:
                raise RuntimeError("the upstream never became healthy")
            await asyncio.sleep(0.05)

    async def stop(self) -> None:
        await self.events.put({"type": "lifespan.shutdown"})
        if self.task is not None:
            await asyncio.wait_for(self.task, 30)


def production_config(upstream: str, redis_url: str):  # noqa: ANN201
    return parse_config({
        "redis_url": redis_url,
        "tenants": [{"name": "bench", "api_key_sha256": [hashlib.sha256(KEY.encode())
                                                         .hexdigest()]}],
        "pools": [{"name": "bench", "engine": "sglang", "model": "bench", "method": "eagle",
                   "k": 3, "workers": [upstream]}]})


async def _cpu(step: Callable[[], object], calls: int) -> float:
    """Median thread CPU (us) of a sync step."""
    times = []
    for _ in range(calls):
        start = time.thread_time_ns()
        step()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


async def _acpu(step: Callable[[], Awaitable[object]], calls: int) -> float:
    times = []
    for _ in range(calls):
        start = time.thread_time_ns()
        await step()
        times.append(time.thread_time_ns() - start)
    return statistics.median(times) / 1000


def _yardstick() -> int:
    return sum(range(5000))


async def _busy(gw, step: Callable[[], object], calls: int) -> float:  # noqa: ANN001
    """`_cpu` with every pool busy (as under load: `busy_per_worker` requests in flight on
    each worker), so the SLO-aware policy checks the pick against the tenant's SLO."""
    workers = [w for pool in gw.pools.values() for w in pool.workers]
    extra = int(gw.config.admission.busy_per_worker) + 1
    for worker in workers:
        worker.outstanding += extra
    try:
        return await _cpu(step, calls)
    finally:
        for worker in workers:
            worker.outstanding -= extra


async def _concurrent(app, calls: int, width: int) -> float:  # noqa: ANN001
    """Main-thread CPU (us) a whole request, `width` in flight (the pools busy: the
    SLO-aware policy's full check runs), over at least `calls` requests."""
    batches = max(calls // width, 4)
    start = time.thread_time_ns()
    for _ in range(batches):
        await asyncio.gather(*(post(app, BODY) for _ in range(width)))
    return (time.thread_time_ns() - start) / (batches * width) / 1000


async def stages(app, calls: int) -> dict:  # noqa: ANN001
    gw = app.state.gateway
    for _ in range(200):  # warm: connections, caches, the first refit
        assert await post(app, BODY) == 200
    body = orjson.loads(BODY)
    request = parse_request(body, "chat")
    tenant = gw.auth.tenant(f"Bearer {KEY}")
    profile = gw.classify(request, tenant.name)
    decision, pools = gw.router.route(request, profile, Pin())
    lease, result = await gw.dispatcher.generate(request, decision, pools)
    outcome = Outcome(request, profile, tenant, decision, Timer(), lease.load, lease.workers,
                      result.usage, result.spec, True, result.finish_reason)
    entry, _ = request_record(outcome, time.perf_counter())
    fanout = gw.reporter.recorder
    prometheus, routing, tenant_metrics, recent = fanout.recorders

    async def receive() -> dict:
        return {"type": "http.request", "body": BODY, "more_body": False}

    async def admission() -> None:
        gw.admission.leave(await gw.admission.enter(decision.pool, tenant, time.perf_counter()))

    def record() -> None:
        request_record(outcome, time.perf_counter())
        routing.record(entry)

    def metrics() -> None:
        prometheus.record(entry)
        tenant_metrics.record(entry)
        recent.record(entry)
        app.http_metrics.observe("/v1/chat/completions", 200, 0.001)

    yardstick = await _cpu(_yardstick, calls)
    out = {
        "parse": await _cpu(lambda: parse_request(orjson.loads(BODY), "chat"), calls),
        "authenticate": await _cpu(lambda: gw.auth.tenant(f"Bearer {KEY}"), calls),
        "read request (authenticated, body read)": await _acpu(
            lambda: read_request(gw, scope_for(BODY), receive), calls),
        "classify": await _cpu(lambda: gw.classify(request, tenant.name), calls),
        "decide": await _cpu(lambda: gw.router.route(request, profile, Pin()), calls),
        "decide, pool busy": await _busy(gw, lambda: gw.router.route(request, profile, Pin()),
                                         calls),
        "admission": await _acpu(admission, calls) if gw.admission is not None else 0.0,
        "upstream call": await _acpu(lambda: gw.dispatcher.generate(request, decision, pools),
                                     calls),
        "relay": await _cpu(lambda: response_body(request, result, decision), calls),
        "record": await _cpu(record, calls),
        "metrics": await _cpu(metrics, calls),
    }
    out["sum of stages"] = round(sum(v for k, v in out.items() if k not in APART), 1)
    out["whole request, main thread"] = await _acpu(lambda: post(app, BODY), calls)
    out["whole request, 32 in flight, main thread"] = await _concurrent(app, calls, 32)
    n = 8 * max(calls // 8, 8)
    process, thread = time.process_time(), time.thread_time()
    for _ in range(n // 8):
        await asyncio.gather(*(post(app, BODY) for _ in range(8)))
    other = (time.process_time() - process) - (time.thread_time() - thread)
    out["other threads (telemetry flush, refit)"] = other / n * 1e6
    # the machine's speed at the time, before and after the rows: on a shared box the
    # rows of two runs compare as multiples of it
    out["yardstick, sum(range(5000))"] = (yardstick + await _cpu(_yardstick, calls)) / 2
    return {k: round(v, 1) for k, v in out.items()}


async def _floor(upstream: str, calls: int) -> float:
    """The whole request through `bench.gateway.minproxy`'s app on the gateway's own upstream
    client: what any request costs here before specroute does anything."""
    from bench.gateway.minproxy import make_http1_app

    proxy = make_http1_app(upstream)
    life = Lifespan(proxy)
    await life.start(ready=False)
    try:
        for _ in range(200):
            await post(proxy, BODY)
        return await _acpu(lambda: post(proxy, BODY), calls)
    finally:
        await life.stop()


async def ablation(app, upstream: str, calls: int) -> dict:  # noqa: ANN001
    """The whole request's main-thread CPU as the gateway's parts are taken away one
    after another, cumulatively (each row: what is left once that part is gone too),
    down to the same request through the minimal proxy on the same upstream client.
    Each part's cost is its row's drop; measured in context (caches, loop turns), not
    in isolation as `stages` does."""
    from gateway.classifier.minimal import minimal_profile

    gw = app.state.gateway
    for _ in range(200):
        assert await post(app, BODY) == 200
    out = {"production": await _acpu(lambda: post(app, BODY), calls)}
    # a reporter that reports nothing (the Reporter is compiled: its methods cannot be
    # replaced on the instance)
    gw.reporter = SimpleNamespace(record=lambda *args, **kwargs: None)
    out["- record and metrics (after the response)"] = await _acpu(lambda: post(app, BODY),
                                                                   calls)
    gw.classify.classify = minimal_profile
    out["- classify (the minimal profile instead)"] = await _acpu(lambda: post(app, BODY),
                                                                  calls)
    async def enter(pool, tenant, arrived):  # noqa: ANN001, ANN202 - a slot, never a wait
        return Ticket(pool, tenant, arrived, arrived, 0)

    gw.admission.enter, gw.admission.leave = enter, lambda ticket: None
    out["- admission"] = await _acpu(lambda: post(app, BODY), calls)
    assess, route, decided = gw.router.assess, gw.router.route_assessed, []

    def assess_once(request, profile, pin=NO_PIN):  # noqa: ANN001, ANN202
        if not decided:
            decided.append(route(assess(request, profile, pin), profile, pin))
        return []

    gw.router.assess = assess_once
    gw.router.route_assessed = lambda assessed, profile, pin, explain=False: decided[0]
    out["- decide (one decision, reused)"] = await _acpu(lambda: post(app, BODY), calls)
    out["minimal proxy, same upstream client"] = await _floor(upstream, calls)
    return {k: round(v, 1) for k, v in out.items()}


async def profile(app, calls: int, top: int = 30) -> dict:  # noqa: ANN001
    """cProfile over `calls` whole requests, 32 in flight: the `top` functions by own
    time, us per request (own, and cumulative)."""
    import cProfile
    import pstats

    for _ in range(200):
        assert await post(app, BODY) == 200
    batches = max(calls // 32, 1)
    profiler = cProfile.Profile(time.thread_time)  # CPU: preemption on a shared box is not ours
    profiler.enable()
    for _ in range(batches):
        await asyncio.gather(*(post(app, BODY) for _ in range(32)))
    profiler.disable()
    n = batches * 32
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    rows = sorted(stats.items(), key=lambda item: -item[1][2])[:top]
    return {f"{Path(f).name}:{line} {name}": (round(tt / n * 1e6, 1), round(ct / n * 1e6, 1))
            for (f, line, name), (_, _, tt, ct, _) in rows}


def run(calls: int, ablate: bool = False, profiled: bool = False) -> dict:
    procs = []
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        try:
            redis, redis_url = start_redis(tmp)
            procs.append(redis.proc)
            port = free_port()
            upstream = f"http://127.0.0.1:{port}"
            bench_gateway._start(procs, [sys.executable, "-m", "bench.gateway.upstream", "--port",
                                         str(port)], f"{upstream}/health", "upstream",
                                 tmp / "upstream.log")
            app = create_app(production_config(upstream, redis_url))

            async def main() -> dict:
                life = Lifespan(app)
                await life.start()
                try:
                    if profiled:
                        return await profile(app, calls)
                    return await (ablation(app, upstream, calls) if ablate
                                  else stages(app, calls))
                finally:
                    await life.stop()

            return asyncio.run(main())
        finally:
            for proc in procs:
                proc.terminate()
            for proc in procs:
                proc.wait(15)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=400)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--ablate", action="store_true",
                        help="take the gateway's parts away one by one instead")
    parser.add_argument("--profile", action="store_true",
                        help="cProfile whole requests, 32 in flight: own time per function")
    args = parser.parse_args(argv)
    result = run(args.calls, args.ablate, args.profile)
    if args.json:
        print(json.dumps(result))
    else:
        head = "function | own, cumulative us per request" if args.profile else \
            f"{'what is left' if args.ablate else 'stage'} | CPU us per request (median)"
        print(f"| {head} |\n|---|---|")
        for stage, us in result.items():
            print(f"| {stage} | {us} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
