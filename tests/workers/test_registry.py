"""Worker registry against a real Redis: keys, TTL heartbeats, pruning, drain flags."""

from __future__ import annotations

import json
import os
import time

import redis

from policies.keys import draining_key, pool_workers_key, worker_key
from tests.conftest import free_port
from workers.fleet.registry import (
    Registration,
    is_draining,
    list_workers,
    new_worker_info,
    set_draining,
)


def _info(url: str, pool: str = "eagle", k: int = 4):
    return new_worker_info(url=url, pool=pool, engine="sglang", method="eagle", k=k,
                           model="llama", pid=os.getpid())


def test_register_writes_key_with_ttl_and_stop_deletes(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    url = "http://127.0.0.1:30001"
    reg = Registration(redis_url, _info(url), ttl=3.0).start()
    key = worker_key("eagle", url)
    stored = json.loads(client.get(key))
    assert stored["url"] == url and stored["k"] == 4 and stored["engine"] == "sglang"
    assert 0 < client.pttl(key) <= 3000
    assert client.sismember(pool_workers_key("eagle"), url)
    assert [w.url for w in list_workers(client)] == [url]
    reg.stop()
    assert client.get(key) is None
    assert not client.sismember(pool_workers_key("eagle"), url)
    assert list_workers(client, "eagle") == []


def test_heartbeat_outlives_ttl_and_update_changes_k(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    url = "http://127.0.0.1:30002"
    reg = Registration(redis_url, _info(url), ttl=0.6).start()
    try:
        time.sleep(1.5)  # 2.5 TTLs: only the heartbeat keeps the key
        assert client.exists(worker_key("eagle", url))
        assert reg.beats >= 3
        reg.update(k=7)
        assert [w.k for w in list_workers(client, "eagle")] == [7]
    finally:
        reg.stop()


def test_dead_worker_expires_and_is_pruned(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    alive, dead = "http://127.0.0.1:30003", "http://127.0.0.1:30004"
    keep = Registration(redis_url, _info(alive), ttl=5.0).start()
    gone = Registration(redis_url, _info(dead), ttl=0.3)
    gone.beat()  # one beat, no thread: behaves like a worker that died
    try:
        assert {w.url for w in list_workers(client, "eagle")} == {alive, dead}
        time.sleep(0.5)
        assert [w.url for w in list_workers(client, "eagle")] == [alive]
        assert client.smembers(pool_workers_key("eagle")) == {alive}
    finally:
        keep.stop()
        gone.stop()


def test_draining_flag_is_reported_and_cleared(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url, decode_responses=True)
    url = "http://127.0.0.1:30005"
    reg = Registration(redis_url, _info(url, pool="ngram"), ttl=5.0).start()
    try:
        reg.set_draining(True)
        assert is_draining(client, "ngram", url)
        assert [w.draining for w in list_workers(client)] == [True]
        set_draining(client, "ngram", url, False)
        assert [w.draining for w in list_workers(client, "ngram")] == [False]
        reg.set_draining(True)
    finally:
        reg.stop()
    assert not client.exists(draining_key("ngram", url))


def test_heartbeat_survives_redis_outage(redis_url: str) -> None:
    dead_url = f"redis://127.0.0.1:{free_port()}/0"  # nothing listens there
    reg = Registration(dead_url, _info("http://127.0.0.1:30006"), ttl=0.3).start()
    time.sleep(0.4)
    assert reg.beat() is False
    assert reg._thread is not None and reg._thread.is_alive()
    reg.stop()  # logs, does not raise
