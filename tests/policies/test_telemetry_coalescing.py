"""The gateway's coalescing Redis store leaves Redis as the one-by-one writes do, in
far fewer commands (policies/telemetry_store.py)."""

from __future__ import annotations

import time
from dataclasses import replace

import orjson
import pytest
import redis

from policies.aggregates import DECAY_TAU_S, ERA_TAUS
from policies.keys import AGG_INDEX, AGG_PREFIX, STREAM_KEY, desired_k_key
from policies.telemetry import Batch, TelemetryStore
from policies.telemetry_store import CoalescingTelemetryStore
from policies.types import RequestRecord


def _records(start: float) -> list[RequestRecord]:
    base = RequestRecord(model="m", pool="eagle", method="eagle", k=3, task="chat",
                         temperature_bucket="t0", prompt_tokens=10, output_tokens=40,
                         verify_steps=12, accept_length=3.3, load=1, ttft_s=0.02,
                         itl_s=0.01, e2e_s=0.4, workers=2)
    era = ERA_TAUS * DECAY_TAU_S
    out = []
    for i in range(60):  # two contexts, a pinned record, and two era boundaries crossed
        t = start + i * era / 20
        out.append(replace(base, timestamp=t, task="code" if i % 3 else "chat",
                           load=i % 2, pinned=i == 7, output_tokens=30 + i,
                           batch=2.5 if i % 5 else None, extra={"explored": True} if i % 4
                           else {}))
    return out


def _state(client: redis.Redis) -> tuple[dict, int]:
    contexts = sorted(c.decode() for c in client.smembers(AGG_INDEX))
    hashes = {c: {f.decode(): float(v) for f, v in client.hgetall(AGG_PREFIX + c).items()}
              for c in contexts}
    return hashes, client.xlen(STREAM_KEY)


@pytest.mark.parametrize("batch", [1, 7, 60])
def test_same_aggregates_as_one_by_one(redis_url: str, batch: int) -> None:
    client = redis.Redis.from_url(redis_url)
    records = _records(time.time())
    states = []
    for store_type in (TelemetryStore, CoalescingTelemetryStore):
        client.flushdb()
        store = store_type(redis_url)
        for i in range(0, len(records), batch):
            store._write(Batch.of([replace(r) for r in records[i:i + batch]], {"eagle": 3}))
        states.append(_state(client))
        assert client.get(desired_k_key("eagle")) == b"3"
        store._client.close()
    (ours, our_len), (theirs, their_len) = states[1], states[0]
    assert our_len == their_len == len(records)
    entries = [fields[b"r"] for _, fields in client.xrange(STREAM_KEY)]
    assert entries == [orjson.dumps(r.to_dict()) for r in records]  # the same bytes
    assert ours.keys() == theirs.keys() and len(ours) == 4  # (chat, code) x (load 0, 1)
    for context, fields in theirs.items():
        assert ours[context].keys() == fields.keys()
        for name, value in fields.items():
            assert ours[context][name] == pytest.approx(value, rel=1e-9, abs=1e-12)


def test_one_increment_per_context_and_field(redis_url: str) -> None:
    store = CoalescingTelemetryStore(redis_url)
    now = time.time()
    records = [replace(r, timestamp=now, task="chat", load=0) for r in _records(now)[:30]]
    batch = Batch.of(records, {})
    commands = store._commands(batch)
    store._write(batch)
    fields = len(store._client.hgetall(AGG_PREFIX + store._client.smembers(AGG_INDEX).pop()
                                       .decode()))
    assert len(commands) == 30 + fields + 2  # an entry each, then per field, one HDEL, one SADD
    store._client.close()


def test_an_error_reply_fails_the_batch_and_drops_the_connection(redis_url: str) -> None:
    """A key of the wrong type makes one command of the batch fail: the write raises,
    and the next write, on a fresh connection, reads its own reply."""
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    store = CoalescingTelemetryStore(redis_url)
    now = time.time()
    records = [replace(r, timestamp=now, task="chat", load=0) for r in _records(now)[:5]]
    client.set(STREAM_KEY, "not a stream")  # every XADD answers WRONGTYPE, the first raises
    with pytest.raises(redis.ResponseError, match="WRONGTYPE"):
        store._write(Batch.of(records, {}))
    client.delete(STREAM_KEY)
    store._write(Batch.of(records, {"eagle": 4}))
    assert client.get(desired_k_key("eagle")) == b"4"
    assert client.scard(AGG_INDEX) == 1 and client.xlen(STREAM_KEY) == 5
    store._client.close()
