"""`specroute bench live`: the policy's live proof, every configuration side by side.

One set of embedded workers (`specroute up`: one worker per pool) behind three gateways,
each with its own Redis, so no gateway learns from another's traffic:
- `pinned`: the gateway of `specroute up`; serves every request pinned to a pool with
  `x-specroute-pool` (its policy is never asked);
- `adaptive-cold`: restarted on an empty Redis before each concurrency's measurement,
  so its row is what a new deployment gets over its first requests;
- `adaptive-warm`: served `warmup` adaptive requests (other prompts, at the highest
  concurrency) before the first measurement and keeps what it learned across
  concurrencies.
No pinned request reaches either adaptive gateway's telemetry.

Workload: `per_cell` held-out prompts (bench/workload.py, excluded from the drafters'
distillation set; none is in the classifier's labelled set) per task (code, structured,
chat) x temperature (0, 0.8), mixed in a fixed random order. Each prompt is sent to every
configuration in blocks: a block is 2c consecutive prompts sent to one configuration by c
client threads, and the next block goes to the next configuration (the order rotating per
round of blocks), so at concurrency c each configuration serves its own c requests in
flight (as it would serving that traffic alone: a pinned pool's worker batches them, the
adaptive gateways spread them as they decide), while slow drift of the machine still hits
every configuration alike. A block's last requests run with fewer in flight; every
configuration's blocks alike. bench/live_report.py turns the records into the tables.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
import redis
import yaml

from bench.live_report import COLD, WARM, Record, class_name, render, summarize
from bench.workload import TASKS, prompts
from policies.telemetry import STREAM_KEY
from workers.processes import Child, free_port, spawn, start_redis, wait_child, wait_http

TEMPERATURES = (0.0, 0.8)
REQUEST_TIMEOUT_S = 600.0


@dataclass(frozen=True, slots=True)
class Settings:
    per_cell: int  # prompts per (task, temperature)
    warmup: int  # adaptive requests the warm gateway serves before the first measurement
    max_tokens: int
    concurrency: tuple[int, ...]
    seed: int = 0
    classes: tuple[str, ...] = ()  # task/temperature names; empty: every task at both

    @property
    def cells(self) -> list[tuple[str, float]]:
        every = [(task, t) for task in TASKS for t in TEMPERATURES]
        if not self.classes:
            return every
        unknown = set(self.classes) - {class_name(*cell) for cell in every}
        if unknown:
            raise ValueError(f"unknown classes {sorted(unknown)}; expected task/t0 or "
                             f"task/t0.8 with a task of {', '.join(TASKS)}")
        return [cell for cell in every if class_name(*cell) in self.classes]

    def describe(self, model: str, pools: list[str]) -> str:
        which = (f"{self.per_cell} per task x temperature 0 / 0.8" if not self.classes
                 else f"{self.per_cell} per class of {', '.join(self.classes)}")
        return (f"model {model}; {len(self.cells) * self.per_cell} held-out "
                f"prompts per configuration and concurrency ({which}), seed {self.seed}, "
                f"max_tokens {self.max_tokens}, warm-up "
                f"{self.warmup} requests at c={max(self.concurrency)}, concurrency {','.join(map(str, self.concurrency))}, "
                f"{len(pools)} pools, 1 torch thread per worker")


@dataclass(frozen=True, slots=True)
class Job:
    config: str
    cls: str
    body: dict
    item: int = -1  # index in the measured workload (-1: warm-up)


def workload(model: str, settings: Settings, seed: int, count: int | None = None,
             exclude: frozenset[str] = frozenset()) -> list[tuple[str, dict]]:
    """(class, chat body) in a fixed random order: `per_cell` prompts per class, or `count`
    items spread evenly over the classes, none of whose texts is in `exclude`."""
    cells = settings.cells
    per_cell = settings.per_cell if count is None else -(-count // len(cells))
    items: list[tuple[str, dict]] = []
    for task, temperature in cells:
        drawn = prompts(task, 2 * per_cell + len(exclude), seed)
        kept = [p for p in drawn if p.messages[-1]["content"] not in exclude][:per_cell]
        for i, prompt in enumerate(kept):
            body = prompt.chat_body(model, settings.max_tokens, temperature)
            body["seed"] = seed + i
            items.append((class_name(task, temperature), body))
    random.Random(seed).shuffle(items)
    return items[:count] if count is not None else items


BLOCK_PER_THREAD = 2  # requests per client thread in one configuration's block


def blocks(items: list[tuple[str, dict]], configs: list[str], size: int) -> list[list[Job]]:
    """Every item to every configuration, in one-configuration blocks of `size` consecutive
    items; the order of configurations rotates per round of blocks."""
    out = []
    for r, start in enumerate(range(0, len(items), size)):
        chunk = list(enumerate(items[start:start + size], start))
        shift = r % len(configs)
        out += [[Job(c, cls, body, i) for i, (cls, body) in chunk]
                for c in configs[shift:] + configs[:shift]]
    return out


class Runner:
    """Sends jobs with c in flight; counts, per gateway and class, the requests it served."""

    def __init__(self, urls: dict[str, str]) -> None:
        self.urls = urls
        self.seen: dict[tuple[str, str], int] = defaultdict(int)
        self.lock = threading.Lock()
        self.client = httpx.Client(timeout=REQUEST_TIMEOUT_S,
                                   limits=httpx.Limits(max_connections=64))

    def reset(self, gateway: str) -> None:
        with self.lock:
            for key in [key for key in self.seen if key[0] == gateway]:
                del self.seen[key]

    def run(self, jobs: list[Job], concurrency: int, label: str | None = None) -> list[Record]:
        """`jobs` in order, `concurrency` of them in flight: each client thread takes the
        next job when its last one is answered."""
        queue = iter(jobs)
        records: list[Record] = []

        def worker() -> None:
            while True:
                with self.lock:
                    job = next(queue, None)
                    if job is None:
                        return
                    gateway = job.config if job.config in (COLD, WARM) else "pinned"
                    seen = self.seen[(gateway, job.cls)]
                    self.seen[(gateway, job.cls)] += 1
                record = self.send(job, gateway, seen, concurrency, label)
                with self.lock:
                    records.append(record)

        with ThreadPoolExecutor(concurrency) as pool:
            for future in [pool.submit(worker) for _ in range(concurrency)]:
                future.result()
        return records

    def run_blocks(self, jobs: list[list[Job]], concurrency: int) -> list[Record]:
        """Block after block, each with `concurrency` in flight and answered in full before
        the next starts."""
        return [record for block in jobs for record in self.run(block, concurrency)]

    def send(self, job: Job, gateway: str, seen: int, concurrency: int,
             label: str | None) -> Record:
        headers = {} if gateway != "pinned" else {"x-specroute-pool": job.config}
        config = label or job.config
        t0 = time.perf_counter()
        try:
            resp = self.client.post(f"{self.urls[gateway]}/v1/chat/completions", json=job.body,
                                    headers=headers)
            elapsed = time.perf_counter() - t0
            resp.raise_for_status()
        except httpx.HTTPError as exc:
            return Record(concurrency, config, job.cls, 0, 0.0, "", seen=seen, error=str(exc),
                          item=job.item)
        data = resp.json()
        facts = data.get("specroute", {})
        return Record(concurrency, config, job.cls, data["usage"]["completion_tokens"], elapsed,
                      facts.get("pool", ""), facts.get("k") or 0, seen,
                      reason=facts.get("reason", ""), item=job.item)

    def close(self) -> None:
        self.client.close()


class Stack:
    """`specroute up` plus the two adaptive gateways, each on its own Redis."""

    def __init__(self, workdir: Path, model: str | None, methods: str | None) -> None:
        self.workdir = workdir
        workdir.mkdir(parents=True, exist_ok=True)  # --workdir may name a new folder
        self.port = free_port()
        args = [sys.executable, "-m", "specroute.cli", "up", "--port", str(self.port),
                "--workdir", str(workdir / "up")]
        args += ["--model", model] if model else []
        args += ["--methods", methods] if methods else []
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.log = open(workdir / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.up = subprocess.Popen(args, stdout=self.log, stderr=subprocess.STDOUT, env=env,
                                   start_new_session=True)
        self.children: dict[str, list[Child]] = {}
        self.urls = {"pinned": f"http://127.0.0.1:{self.port}"}
        self.redis_urls: dict[str, str] = {}

    def start(self) -> None:
        wait_http(f"{self.urls['pinned']}/ready", 600, self.up, "specroute up",
                  Path(self.log.name))
        self.config = yaml.safe_load((self.workdir / "up" / "config.yaml").read_text())
        for gateway in (COLD, WARM):
            self.start_gateway(gateway, wait=False)
        for gateway in (COLD, WARM):
            self.wait_gateway(gateway)

    @property
    def pools(self) -> list[str]:
        return [p["name"] for p in self.config["pools"]]

    @property
    def plain(self) -> str:
        return next(p["name"] for p in self.config["pools"] if p["method"] == "plain")

    @property
    def model(self) -> str:
        return self.config["pools"][0]["model"]

    def start_gateway(self, gateway: str, wait: bool = True) -> None:
        """(Re)start `gateway` on a new, empty Redis."""
        self.stop_gateway(gateway)
        home = self.workdir / gateway
        home.mkdir(exist_ok=True)
        redis_child, redis_url = start_redis(home)
        port = free_port()
        config = {**self.config, "redis_url": redis_url,
                  "server": {**self.config.get("server", {}), "port": port}}
        path = home / "config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        child = spawn("gateway", [sys.executable, "-m", "specroute.cli", "gateway", "--config",
                                  str(path), "--policy", "learned"], home)
        self.children[gateway] = [redis_child, child]
        self.urls[gateway] = f"http://127.0.0.1:{port}"
        self.redis_urls[gateway] = redis_url
        if wait:
            self.wait_gateway(gateway)

    def wait_gateway(self, gateway: str) -> None:
        wait_child(f"{self.urls[gateway]}/ready", self.children[gateway][-1], timeout=120)

    def telemetry(self, gateway: str, expected: int, timeout: float = 10.0) -> list[dict]:
        """The records in `gateway`'s telemetry stream (what its policy learns from), once
        `expected` have arrived (they are written off the request path) or at `timeout`."""
        client = redis.Redis.from_url(self.redis_urls[gateway])
        try:
            deadline = time.monotonic() + timeout
            while client.xlen(STREAM_KEY) < expected and time.monotonic() < deadline:
                time.sleep(0.1)
            entries: list[tuple[bytes, dict[bytes, bytes]]] = client.xrange(STREAM_KEY)  # type: ignore[assignment]
            return [json.loads(fields[b"r"]) for _, fields in entries]
        finally:
            client.close()

    def stop_gateway(self, gateway: str) -> None:
        for child in reversed(self.children.pop(gateway, [])):
            child.proc.terminate()
            try:
                child.proc.wait(10)
            except subprocess.TimeoutExpired:
                child.proc.kill()

    def stop(self) -> None:
        for gateway in list(self.children):
            self.stop_gateway(gateway)
        if self.up.poll() is None:
            os.killpg(self.up.pid, signal.SIGTERM)
            try:
                self.up.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.up.pid, signal.SIGKILL)
        self.log.close()


@contextmanager
def running_stack(workdir: Path, model: str | None, methods: str | None) -> Iterator[Stack]:
    stack = Stack(workdir, model, methods)
    try:
        stack.start()
        yield stack
    finally:
        stack.stop()


def audit_cold(stack: Stack, records: list[Record]) -> dict:
    """What the cold gateway's policy learned from: its telemetry stream must hold exactly
    its own requests of this concurrency, so no pinned request taught it."""
    own = [r for r in records if r.config == COLD]
    stream = stack.telemetry(COLD, len(own))
    return {"own_requests": len(own), "telemetry_records": len(stream),
            "same_pools": sorted(r.pool for r in own if not r.error)
            == sorted(t["pool"] for t in stream)}


def measure(stack: Stack, settings: Settings,
            progress: bool = True) -> tuple[list[Record], dict[int, dict]]:
    """Warm-up, then per concurrency: a fresh cold gateway and the blocks.
    Returns the records and, per concurrency, the audit of the cold gateway's telemetry."""
    runner = Runner(stack.urls)
    items = workload(stack.model, settings, settings.seed)
    measured = frozenset(body["messages"][-1]["content"] for _, body in items)
    warm = workload(stack.model, settings, settings.seed + 1000, settings.warmup, measured)
    configs = [COLD, WARM, *stack.pools]
    records: list[Record] = []
    audits: dict[int, dict] = {}
    try:
        started = time.monotonic()
        for n, conc in enumerate(settings.concurrency):
            if n:
                stack.start_gateway(COLD)
                runner.urls = stack.urls
                runner.reset(COLD)
            if n == 0 and warm:  # at the highest concurrency: the same requests in less time
                top = max(settings.concurrency)
                records += runner.run([Job(WARM, cls, body) for cls, body in warm], top, "warmup")
                _say(progress, f"warm-up: {len(warm)} requests at c={top}", started)
            measured_here = runner.run_blocks(
                blocks(items, configs, BLOCK_PER_THREAD * conc), conc)
            records += measured_here
            audits[conc] = audit_cold(stack, measured_here)
            _say(progress, f"concurrency {conc}: {len(measured_here)} requests", started)
    finally:
        runner.close()
    return records, audits


def _say(progress: bool, message: str, started: float) -> None:
    if progress:
        print(f"[bench live {time.monotonic() - started:6.0f}s] {message}", file=sys.stderr,
              flush=True)


def run(settings: Settings, model: str | None = None, methods: str | None = None,
        workdir: Path | None = None) -> tuple[dict, str]:
    """Start the stack, measure, and return (summary, printed table)."""
    with tempfile.TemporaryDirectory() as tmp, \
            running_stack(workdir or Path(tmp), model, methods) as stack:
        records, audits = measure(stack, settings)
        summary = summarize(records, stack.pools, stack.plain)
        for conc, audit in audits.items():
            summary[conc]["cold_audit"] = audit
        table = render(summary, settings.describe(stack.model, stack.pools))
        return {"summary": summary, "records": [asdict(r) for r in records]}, table


def main(args: argparse.Namespace) -> int:
    settings = Settings(per_cell=args.per_cell or 1,
                        warmup=args.warmup if args.warmup is not None else (6 if args.quick else 18),
                        max_tokens=args.max_tokens or 48,
                        concurrency=tuple(int(c) for c in (args.concurrency or "1,4").split(",")),
                        seed=args.seed,
                        classes=tuple(c for c in (args.classes or "").split(",") if c))
    try:
        _ = settings.cells  # a mistyped class fails here, before the stack starts
    except ValueError as exc:
        print(f"bench live: {exc}", file=sys.stderr)
        return 2
    try:
        result, table = run(settings, args.model, args.methods,
                            Path(args.workdir) if args.workdir else None)
    except (RuntimeError, TimeoutError) as exc:
        print(f"bench live: the stack did not come up: {exc}", file=sys.stderr)
        return 1
    print(table)
    if args.records:
        Path(args.records).write_text(json.dumps(result))
    if args.json:
        print(json.dumps(result["summary"]))
    return 0
