"""`specroute bench slo`: three tenants with different SLOs and priorities over an
overloaded local stack, with SLO-awareness off and on, in one run.

The stack: the real gateway (`specroute gateway`, a subprocess) in front of stub
OpenAI-compatible workers run here. A stub worker is not a model: it serves
`SLOTS_PER_WORKER` requests at once, each a fixed prefill then one token every
`TOKEN_S` (a fixed per-token delay), so that overload on a 2-core machine is the
gateway's queueing, not CPU contention. Admission gives each worker that many slots
(`admission.max_inflight_per_worker`) and the pool a queue of `MAX_QUEUE`; the offered
load is ~1.5x what the slots serve.

Open-loop Poisson arrivals per tenant, the same seeded schedule for both modes, all
streamed. A request meets its SLO when its time to first token and its mean time per
output token are within its tenant's targets; a shed request (429) and a failed one do
not. Attainment = met / sent; goodput = output tokens of requests that met their SLO
per second of the run.

- off: `admission.slo_aware: false`: one first-come-first-served queue per pool; when
  it is full the newcomer is refused, whoever it is.
- on (the default): earliest deadline first with priority, reserved slots for the top
  priority, lower priorities shed before a higher one misses, and a full queue sheds its
  lowest priority (gateway/routing/admission.py).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import orjson
import yaml
from aiohttp import web

TOKEN_S = 0.02  # the stub's fixed time per output token
PREFILL_S = 0.05
SLOTS_PER_WORKER = 2
WORKERS = 2


@dataclass(frozen=True)
class Tenant:
    name: str
    priority: int
    ttft_ms: float
    tpot_ms: float
    rate: float  # requests per second
    max_tokens: int


TENANTS = (Tenant("interactive", 10, 800, 100, 4.0, 16),
           Tenant("standard", 5, 3000, 200, 2.0, 32),
           Tenant("batch", 0, 20000, 1000, 2.5, 64))
MAX_QUEUE = 12  # per pool: a bounded queue, so overload ends in shedding, not in waiting


@dataclass
class Outcome:
    tenant: str
    status: int = 0
    ttft_s: float = 0.0
    tpot_s: float = 0.0
    tokens: int = 0
    met: bool = False
    retry_after: bool = False  # a 429 that said when to come back


# ---------------------------------------------------------------- stub worker
def stub_app() -> web.Application:
    slots = asyncio.Semaphore(SLOTS_PER_WORKER)

    async def chat(request: web.Request) -> web.StreamResponse:
        body = await request.json(loads=orjson.loads)
        tokens = int(body.get("max_tokens") or 16)
        async with slots:
            await asyncio.sleep(PREFILL_S)
            response = web.StreamResponse(headers={"content-type": "text/event-stream"})
            await response.prepare(request)
            head = {"id": "cmpl-stub", "object": "chat.completion.chunk", "created": 0,
                    "model": body.get("model")}
            for i in range(tokens):
                await asyncio.sleep(TOKEN_S if i else 0)
                choice = {"index": 0, "delta": {"content": f"w{i} "},
                          "finish_reason": "length" if i == tokens - 1 else None}
                await response.write(b"data: " + orjson.dumps({**head, "choices": [choice]})
                                     + b"\n\n")
            usage = {"prompt_tokens": 8, "completion_tokens": tokens, "total_tokens": tokens + 8}
            await response.write(b"data: " + orjson.dumps({**head, "choices": [],
                                                           "usage": usage}) + b"\n\n")
            await response.write(b"data: [DONE]\n\n")
            return response

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/health", health)
    return app


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_stubs(count: int) -> list[str]:
    """Stub workers on their own event loop in a daemon thread."""
    ports = [free_port() for _ in range(count)]
    ready = threading.Event()

    def run() -> None:
        loop = asyncio.new_event_loop()
        for port in ports:
            runner = web.AppRunner(stub_app(), access_log=None)
            loop.run_until_complete(runner.setup())
            loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
        ready.set()
        loop.run_forever()

    threading.Thread(target=run, daemon=True, name="slo-stubs").start()
    ready.wait(10)
    return [f"http://127.0.0.1:{port}" for port in ports]


# ---------------------------------------------------------------- gateway and load
def config(workers: list[str], slo_aware: bool) -> dict:
    return {
        "server": {"health_interval_s": 0.5, "log_level": "warning"},
        "admission": {"max_inflight_per_worker": SLOTS_PER_WORKER, "slo_aware": slo_aware,
                      "max_queue": MAX_QUEUE, "max_wait_s": 60},
        "pools": [{"name": "stub", "engine": "openai", "method": "plain", "model": "stub",
                   "workers": workers}],
        "tenants": [{"name": t.name, "api_key_sha256": [key_digest(t.name)],
                     "priority": t.priority, "slo_ttft_ms": t.ttft_ms,
                     "slo_tpot_ms": t.tpot_ms} for t in TENANTS]}


RUN_KEYS: dict[str, str] = {}  # a fresh key per tenant for this run; configs hold digests


def key_of(tenant: str) -> str:
    if tenant not in RUN_KEYS:
        from gateway.tenants.keys import new_key

        RUN_KEYS[tenant] = new_key()
    return RUN_KEYS[tenant]


def key_digest(tenant: str) -> str:
    from gateway.config import hash_api_key

    return hash_api_key(key_of(tenant))


def start_gateway(workdir: Path, cfg: dict) -> tuple[subprocess.Popen, str]:
    port = free_port()
    path = workdir / f"gateway-{port}.yaml"
    path.write_text(yaml.safe_dump(cfg))
    log = open(workdir / f"gateway-{port}.log", "wb")  # noqa: SIM115 - the process's log
    proc = subprocess.Popen([sys.executable, "-m", "specroute.cli", "gateway", "--config",
                             str(path), "--port", str(port), "--policy", "first"],
                            stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gateway exited; see {workdir}")
        try:
            if httpx.get(url + "/ready", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise TimeoutError("gateway did not become ready")


def schedule(duration_s: float, seed: int) -> list[tuple[float, Tenant]]:
    rng = random.Random(seed)
    arrivals = []
    for tenant in TENANTS:
        at = rng.expovariate(tenant.rate)
        while at < duration_s:
            arrivals.append((at, tenant))
            at += rng.expovariate(tenant.rate)
    return sorted(arrivals, key=lambda a: a[0])


async def one(client: httpx.AsyncClient, url: str, tenant: Tenant) -> Outcome:
    out = Outcome(tenant.name)
    started = time.perf_counter()
    body = {"model": "stub", "stream": True, "max_tokens": tenant.max_tokens,
            "messages": [{"role": "user", "content": "go"}]}
    first = last = 0.0
    try:
        async with client.stream("POST", url + "/v1/chat/completions", json=body,
                                 headers={"Authorization": f"Bearer {key_of(tenant.name)}"}
                                 ) as response:
            out.status = response.status_code
            if response.status_code != 200:
                out.retry_after = "retry-after" in response.headers
                await response.aread()
                return out
            async for line in response.aiter_lines():
                if line.startswith("data: {") and '"content"' in line:
                    last = time.perf_counter()
                    first = first or last
                    out.tokens += 1
    except httpx.HTTPError:
        out.status = 599
        return out
    if not out.tokens:
        return out
    out.ttft_s = first - started
    out.tpot_s = (last - first) / (out.tokens - 1) if out.tokens > 1 else 0.0
    out.met = out.ttft_s * 1000 <= tenant.ttft_ms and out.tpot_s * 1000 <= tenant.tpot_ms
    return out


async def drive(url: str, arrivals: list[tuple[float, Tenant]]) -> list[Outcome]:
    limits = httpx.Limits(max_connections=1000, max_keepalive_connections=100)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        start = time.perf_counter()
        tasks = []
        for at, tenant in arrivals:
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(client, url, tenant)))
        return list(await asyncio.gather(*tasks))


@dataclass
class Row:
    mode: str
    tenant: Tenant
    outcomes: list[Outcome] = field(default_factory=list)

    def summary(self, duration_s: float) -> dict:
        sent = len(self.outcomes)
        ok = [o for o in self.outcomes if o.status == 200 and o.tokens]
        met = [o for o in ok if o.met]
        ttfts = sorted(o.ttft_s for o in ok)
        p95 = ttfts[min(int(0.95 * len(ttfts)), len(ttfts) - 1)] if ttfts else 0.0
        return {"mode": self.mode, "tenant": self.tenant.name,
                "priority": self.tenant.priority,
                "slo": f"{self.tenant.ttft_ms:.0f}/{self.tenant.tpot_ms:.0f}",
                "sent": sent, "ok": len(ok),
                "shed": sum(1 for o in self.outcomes if o.status == 429),
                "shed_with_retry_after": sum(1 for o in self.outcomes
                                             if o.status == 429 and o.retry_after),
                "met": len(met), "attainment": len(met) / sent if sent else 0.0,
                "goodput": sum(o.tokens for o in met) / duration_s,
                "p95_ttft_s": p95}


def run(duration_s: float, seed: int) -> list[dict]:
    stubs = start_stubs(WORKERS)
    arrivals = schedule(duration_s, seed)
    rows = []
    with tempfile.TemporaryDirectory(prefix="specroute-bench-slo-") as tmp:
        for mode, aware in (("off", False), ("on", True)):
            proc, url = start_gateway(Path(tmp), config(stubs, aware))
            try:
                outcomes = asyncio.run(drive(url, arrivals))
            finally:
                proc.terminate()
                proc.wait(30)
            for tenant in TENANTS:
                row = Row(mode, tenant, [o for o in outcomes if o.tenant == tenant.name])
                rows.append(row.summary(duration_s))
    return rows


def table(rows: list[dict]) -> str:
    lines = ["| SLO-aware | tenant | priority | SLO ttft/tpot ms | sent | ok | shed (429) | "
             "met SLO | attainment | goodput tok/s | p95 TTFT s |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['mode']} | {r['tenant']} | {r['priority']} | {r['slo']} | "
                     f"{r['sent']} | {r['ok']} | {r['shed']} | {r['met']} | "
                     f"{r['attainment']:.2f} | {r['goodput']:.1f} | {r['p95_ttft_s']:.2f} |")
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    duration = args.duration or (8.0 if args.quick else 30.0)
    capacity = WORKERS * SLOTS_PER_WORKER
    offered = sum(t.rate * (PREFILL_S + TOKEN_S * (t.max_tokens - 1)) for t in TENANTS)
    print(f"stub workers: {WORKERS} x {SLOTS_PER_WORKER} slots, {TOKEN_S * 1000:.0f} ms per "
          f"token, {PREFILL_S * 1000:.0f} ms prefill; offered load {offered:.1f} "
          f"slot-seconds/s on {capacity} slots ({offered / capacity:.2f}x); {duration:.0f} s "
          f"per mode, seed {args.seed}")
    rows = run(duration, args.seed)
    print(table(rows))
    if args.json:
        print(orjson.dumps(rows).decode())
    return 0
