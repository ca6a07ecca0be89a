"""The live bench's fleets: which stacks it starts, what each serves, and how requests go.

A *fleet* is one `specroute up` stack (its own Redis, gateway and workers). Every fleet
of a run has the same number of servers (embedded: workers of one torch thread each;
vLLM: servers of one core each):
- `adaptive`: one server per method of `--methods`, behind the learned policy; its
  requests carry no header;
- `N x M` (homogeneous): N servers of method M in one pool; each of its configurations
  pins the pool and, on a per-request-k engine (embedded), one k (`x-specroute-pool`,
  `x-specroute-k`), every request marked benchmark (`x-specroute-benchmark: 1`), so it
  teaches nothing; vLLM pools run the k they were launched with.
Embedded fleets are all up at once (an idle worker costs memory, no CPU): the prompts go
in blocks of 2c consecutive prompts, each block to every configuration of every fleet in
an order drawn afresh per block, one block at a time, so the machine's drift hits every
configuration alike. vLLM fleets (~5 GB a server) run one after another in a random
order per replicate, blocks shuffled within the fleet.

One core per worker (issue 42): at concurrency above 1 the adaptive fleet's requests
share a worker and batch there, while a homogeneous fleet's least-loaded dispatch puts
them on separate one-thread workers; on fewer cores than workers those contend, and the
comparison measures the machine, not the routing (the 2026-12-04 c = 4 figures were at
or above the held-out oracle for that reason). So every embedded worker of a stack is
pinned to a core of its own (`Stack.pin`, every thread of the process), the stack's
gateway and Redis and the bench's client to the cores left, and a concurrency above 1
runs only where the machine has `cores_needed` (bench/live/run.py drops it otherwise and
says so). vLLM servers are bound one per core by `specroute up --engine vllm` itself
(`VLLM_CPU_OMP_THREADS_BIND`).
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import httpx
import redis
import yaml

from bench.live.cores import descendant_pids, is_worker, pin
from bench.live.prompts import Item
from policies.keys import STREAM_KEY
from policies.methods import default_k
from policies.options import candidate_ks
from policies.types import PoolView
from workers.processes import free_port, stop_group, wait_http

ADAPTIVE = "adaptive"
T = TypeVar("T")
REQUEST_TIMEOUT_S = 600.0
BLOCK_PER_THREAD = 2
VLLM_K = {"plain": 0, "ngram": 4, "medusa": 4, "eagle": 3}  # specroute.vllm_stack.VLLM_METHODS


@dataclass(frozen=True, slots=True)
class Config:
    name: str  # "adaptive", "plain", "ngram k=3"
    pool: str | None = None  # pinned pool (None: the policy decides)
    k: int | None = None  # pinned k (per-request-k pools only)

    @property
    def headers(self) -> dict[str, str]:
        if self.pool is None:
            return {}
        out = {"x-specroute-pool": self.pool, "x-specroute-benchmark": "1"}
        return out | ({"x-specroute-k": str(self.k)} if self.k is not None else {})


@dataclass(frozen=True, slots=True)
class Fleet:
    name: str
    methods: tuple[str, ...]  # one entry per server
    configs: tuple[Config, ...]


def adaptive_ks(method: str) -> list[int]:
    """The k's the adaptive gateway may pick on its per-request-k pool of `method` (the
    pool `specroute up` configures: the method's default k, per-request k, the policy's
    `PoolView.max_k`). The k trust region (`k_trust_margin` above the largest k measured)
    does not bound a run: one request at its top (`min_k_requests` 1) and exploration
    (+-2) move it up, so every k from 1 to the pool's max_k is in reach."""
    view = PoolView(f"embedded-{method}", "embedded", method, default_k(method), True, 1, 0)
    return [k for k in candidate_ks(view) if k > 0]


def k_grid(method: str, ks: tuple[str, ...] | None) -> list[int]:
    """The k's measured on a per-request-k pool: every k the adaptive gateway may pick
    there (`adaptive_ks`; k = 0 is plain decoding, which the plain fleet measures), or the
    subset `ks` of them: "2" (every method) or "ngram:6" (that method only)."""
    return [k for k in adaptive_ks(method)
            if ks is None or str(k) in ks or f"{method}:{k}" in ks]


def missing_ks(methods: list[str], homogeneous: list[str],
               ks: tuple[str, ...] | None) -> dict[str, list[int]]:
    """Per method of the adaptive fleet that a homogeneous fleet measures per k, the k's
    the adaptive gateway may pick that `ks` leaves unmeasured (the oracle cannot choose
    them)."""
    out = {}
    for m in methods:
        if m != "plain" and m in homogeneous:
            gap = sorted(set(adaptive_ks(m)) - set(k_grid(m, ks)))
            if gap:
                out[m] = gap
    return out


def fleets(engine: str, methods: list[str], homogeneous: list[str],
           ks: tuple[str, ...] | None = None) -> list[Fleet]:
    size = len(methods)
    out = [Fleet(ADAPTIVE, tuple(methods), (Config(ADAPTIVE),))]
    for m in homogeneous:
        prefix = "vllm" if engine == "vllm" else "embedded"
        pool = f"{prefix}-{m}"
        if m == "plain":
            configs: tuple[Config, ...] = (Config("plain", pool),)
        elif engine == "vllm":
            configs = (Config(f"{m} k={VLLM_K[m]}", pool),)
        else:
            configs = tuple(Config(f"{m} k={k}", pool, k) for k in k_grid(m, ks))
        out.append(Fleet(f"{size}x{m}", (m,) * size, configs))
    return out


def schedule(items: list[Item], configs: Sequence[T], size: int,
             rng: random.Random) -> list[tuple[T, list[Item]]]:
    """Blocks of `size` consecutive items, each to every configuration, the configurations'
    order shuffled per block."""
    out = []
    for start in range(0, len(items), size):
        order = list(configs)
        rng.shuffle(order)
        out += [(c, items[start:start + size]) for c in order]
    return out


@dataclass(frozen=True, slots=True)
class Record:
    replicate: int
    concurrency: int
    fleet: str
    config: str
    cls: str
    fold: int
    item: int  # index in the (replicate, concurrency) draw; -1: warm-up
    tokens: int
    seconds: float
    pool: str = ""  # the pool that served it
    k: int = 0
    error: str = ""
    # what the adaptive gateway made of it (the answer's `specroute.reason`: "task/bucket:
    # ...", "(exploring)" on a try): the task it classified, and whether it explored
    routed: str = ""
    explored: bool = False


def read_reason(reason: str) -> tuple[str, bool]:
    """The task a decision's reason names ("code/t0: eagle k=1 ...") and whether it was
    an exploration try; ("", False) for a reason without them (a pinned request's)."""
    head = reason.split(":", 1)[0]
    task = head.split("/", 1)[0] if "/" in head and " " not in head else ""
    return task, "(exploring)" in reason


Command = Callable[[int, Path], list[str]]  # (gateway port, workdir) -> argv
BIND_RETRIES = 3  # fresh starts of a stack whose server lost its port to another process
BIND_FAILED = ("address already in use", "errno 98")


def up_command(fleet: Fleet, engine: str, model: str | None,
               follow_fleet: bool = False) -> Command:
    """`specroute up` for `fleet`, on the port it is given."""
    def command(port: int, workdir: Path) -> list[str]:
        args = [sys.executable, "-m", "specroute.cli", "up", "--port", str(port),
                "--workdir", str(workdir), "--methods", ",".join(fleet.methods)]
        args += ["--engine", "vllm"] if engine == "vllm" else []
        args += ["--model", model] if model else []
        return args + (["--follow-fleet"] if follow_fleet else [])
    return command


class Stack:
    """One `specroute up` of a fleet.

    Every server of a stack binds a port picked free a moment before (`free_port`: bound
    to port 0, read back, released), the gateway's by the bench and the workers' and
    Redis's by `specroute up`; another process may take it in between (an outgoing
    connection's source port is drawn from the same range), and the server then fails
    with `[Errno 98] address already in use` (a 12-minute run was lost to it, issue 42).
    `launch` starts the stack again on fresh ports when that is why it stopped."""

    def __init__(self, fleet: Fleet, engine: str, model: str | None, workdir: Path,
                 follow_fleet: bool = False, command: Command | None = None) -> None:
        self.fleet = fleet
        self.work = workdir
        workdir.mkdir(parents=True, exist_ok=True)
        self.command = command or up_command(fleet, engine, model, follow_fleet)
        self.attempts = 0
        self.lock = threading.Lock()
        self._spawn()

    def _spawn(self) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        self.spawned_at = time.time()
        self.log = open(self.work / "up.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(self.command(self.port, self.work), stdout=self.log,
                                     stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.attempts += 1

    def launch(self, timeout: float) -> None:
        """Until the gateway answers /ready; a start that stopped because one of its servers
        could not bind its port is retried on fresh ports (`BIND_RETRIES` times), its
        `up.log` kept as `up-attempt<n>.log`."""
        while True:
            try:
                wait_http(f"{self.url}/ready", timeout, self.proc, "specroute up",
                          Path(self.log.name))
                return
            except RuntimeError:
                if self.attempts > BIND_RETRIES or not self.bind_failed():
                    raise
            self.stop()
            (self.work / "up.log").rename(self.work / f"up-attempt{self.attempts}.log")
            print(f"bench live: fleet {self.fleet.name}: a server lost its port to another "
                  f"process; starting the stack again on fresh ports", file=sys.stderr,
                  flush=True)
            self._spawn()

    def bind_failed(self) -> bool:
        """Whether a log this start wrote says a server could not bind its port."""
        for path in self.work.glob("*.log"):
            if path.stat().st_mtime >= self.spawned_at - 1.0 and not path.name.startswith(
                    "up-attempt"):
                text = path.read_text(errors="replace").lower()
                if any(sign in text for sign in BIND_FAILED):
                    return True
        return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def pin(self, cores: list[int]) -> dict[int, int]:
        """Each embedded worker on a core of its own (`cores` in order), the stack's other
        processes on the cores left; {worker pid: core}. Needs `len(cores)` above the
        workers' count."""
        pids = descendant_pids(self.proc.pid)
        workers = [pid for pid in pids if is_worker(pid)]
        if len(workers) != len(self.fleet.methods) or len(cores) <= len(workers):
            raise RuntimeError(f"fleet {self.fleet.name}: {len(workers)} workers found for "
                               f"{len(self.fleet.methods)} servers, {len(cores)} cores")
        placed = dict(zip(workers, cores, strict=False))
        rest = set(cores[len(workers):])
        for pid in pids:
            pin(pid, {placed[pid]} if pid in placed else rest)
        return placed

    def start(self, timeout: float) -> None:
        self.launch(timeout)
        self.config = yaml.safe_load((self.work / "config.yaml").read_text())
        self.client = httpx.Client(base_url=self.url, timeout=REQUEST_TIMEOUT_S,
                                   limits=httpx.Limits(max_connections=64))
        self._wait_servers(timeout)

    @property
    def model(self) -> str:
        return self.config["pools"][0]["model"]

    def _wait_servers(self, timeout: float) -> None:
        """Until every pool has as many healthy servers as the fleet started for it (a
        vLLM stack may start fewer than asked for: then the fleets are not equal)."""
        wanted = {m: self.fleet.methods.count(m) for m in self.fleet.methods}
        logs = [path.stem for path in self.work.glob("*.log")]
        started = {m: sum(1 for stem in logs if re.fullmatch(
            rf"(worker-|supervisor-vllm-){m}(-\d+)?", stem)) for m in wanted}
        if started != wanted:  # `up --engine vllm` starts no more servers than cores / memory
            raise RuntimeError(f"fleet {self.fleet.name}: the stack started {started} servers, "
                               f"wanted {wanted}: fleets would not be equal (see {self.log.name})")
        deadline = time.monotonic() + timeout
        while True:
            body = {"model": self.model, "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1}
            got = {c["method"]: c["healthy_workers"] for c in
                   self.client.post("/v1/routing/explain", json=body).json()["candidates"]}
            if all(got.get(m, 0) >= n for m, n in wanted.items()):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"fleet {self.fleet.name}: healthy servers {got}, wanted "
                                   f"{wanted} (see {self.log.name})")
            time.sleep(1.0)

    def send(self, config: Config, item: Item, replicate: int, concurrency: int) -> Record:
        started = time.perf_counter()
        try:
            reply = self.client.post("/v1/chat/completions", headers=config.headers,
                                     json={**item.body, "model": self.model})
            seconds = time.perf_counter() - started
            reply.raise_for_status()
            data = reply.json()
            facts = data.get("specroute", {})
            routed, explored = read_reason(facts.get("reason") or "")
            return Record(replicate, concurrency, self.fleet.name, config.name, item.cls,
                          item.fold, item.index, data["usage"]["completion_tokens"], seconds,
                          facts.get("pool", ""), facts.get("k") or 0, routed=routed,
                          explored=explored)
        except (httpx.HTTPError, ValueError, KeyError) as exc:
            return Record(replicate, concurrency, self.fleet.name, config.name, item.cls,
                          item.fold, item.index, 0, time.perf_counter() - started,
                          error=str(exc)[:200])

    def run(self, jobs: list[tuple[Config, list[Item]]], concurrency: int,
            replicate: int) -> list[Record]:
        """Block after block; within a block `concurrency` client threads each take the
        next prompt when their last one is answered."""
        records: list[Record] = []
        with ThreadPoolExecutor(concurrency) as pool:
            for config, block in jobs:
                queue = iter(block)

                def worker(config: Config = config, queue=queue) -> list[Record]:
                    out: list[Record] = []
                    while True:
                        with self.lock:
                            item = next(queue, None)
                        if item is None:
                            return out
                        out.append(self.send(config, item, replicate, concurrency))

                for future in [pool.submit(worker) for _ in range(concurrency)]:
                    records += future.result()
        return records

    def telemetry(self, expected: int, timeout: float = 15.0) -> dict[str, int]:
        """Records in this stack's telemetry stream (what its policy learns from), learned
        (unpinned) and pinned, once `expected` have arrived or at `timeout`."""
        client = redis.Redis.from_url(self.config["redis_url"])
        try:
            deadline = time.monotonic() + timeout
            while client.xlen(STREAM_KEY) < expected and time.monotonic() < deadline:
                time.sleep(0.2)
            entries: list = client.xrange(STREAM_KEY)  # type: ignore[assignment]
            pinned = sum(1 for _, fields in entries if json.loads(fields[b"r"]).get("pinned"))
            return {"learned_from": len(entries) - pinned, "pinned": pinned}
        finally:
            client.close()

    def stop(self) -> None:
        if getattr(self, "client", None) is not None:
            self.client.close()
        if self.proc.poll() is None:
            stop_group(self.proc)
        self.log.close()
