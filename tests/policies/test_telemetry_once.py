"""A telemetry batch is applied once: sent again (its reply lost to a timeout after Redis
applied it), it is not counted twice (policies/telemetry.py, `APPLY_ONCE_LUA`)."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import replace
from urllib.parse import urlsplit

import pytest
import redis
from conftest import free_port

from policies.keys import AGG_INDEX, STREAM_KEY, desired_k_key, telemetry_batch_key
from policies.telemetry import Batch, TelemetryConfig, TelemetryStore
from policies.telemetry_store import CoalescingTelemetryStore
from tests.policies.test_policy_telemetry import record, wait_for

STORES = [TelemetryStore, CoalescingTelemetryStore]


CONTEXT = "m|eagle|eagle|3|code|t0|1"  # record("eagle", "eagle", 3, ...)'s aggregate


def _counts(client: redis.Redis, store: TelemetryStore) -> tuple[int, float]:
    """Stream entries, and the requests the aggregate in Redis counts (as a replica
    reads it: its decayed count, ~ the number of requests just recorded)."""
    store._refresh()
    assert client.smembers(AGG_INDEX) == {CONTEXT.encode()}
    return client.xlen(STREAM_KEY), store.snapshot()[CONTEXT].n


@pytest.mark.parametrize("store_type", STORES)
def test_the_same_batch_twice_counts_once(redis_url: str, store_type: type) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    store = store_type(redis_url)
    now = time.time()
    batch = Batch.of([replace(record("eagle", "eagle", 3, 3.0, 0.02), timestamp=now)
                      for _ in range(5)], {"eagle": 3})
    store._write(batch)
    once = _counts(client, store)
    assert once[0] == 5 and once[1] == pytest.approx(5, rel=1e-3)
    assert client.ttl(telemetry_batch_key(batch.id)) > 0  # the mark expires
    store._write(batch)  # its reply was lost: the store sends it again
    assert _counts(client, store) == pytest.approx(once, rel=1e-3) and store.replayed == 1
    assert client.get(desired_k_key("eagle")) == b"3"
    store._write(Batch.of(batch.records, {}))  # the same requests in a new batch count
    assert _counts(client, store)[0] == 10
    store._client.close()
    client.close()


class LosesOneReply:
    """A TCP proxy to Redis that, the first time a telemetry write passes, lets Redis run it
    and loses its reply (closes the client's connection): a timeout after the write."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        self.lost = threading.Event()
        self._server = socket.create_server(("127.0.0.1", self.port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.target_port))
            dropping = threading.Event()
            threading.Thread(target=self._up, args=(client, upstream, dropping),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(upstream, client, dropping),
                             daemon=True).start()

    def _up(self, client: socket.socket, upstream: socket.socket,
            dropping: threading.Event) -> None:
        while data := _recv(client):
            if b"XADD" in data and not self.lost.is_set():
                self.lost.set()
                dropping.set()  # before Redis can answer
            upstream.sendall(data)
        upstream.close()

    def _down(self, upstream: socket.socket, client: socket.socket,
              dropping: threading.Event) -> None:
        while data := _recv(upstream):
            if dropping.is_set():
                client.close()  # the reply is lost with the connection
                return
            client.sendall(data)
        client.close()

    def close(self) -> None:
        self._server.close()


def _recv(sock: socket.socket) -> bytes:
    try:
        return sock.recv(65536)
    except OSError:
        return b""


@pytest.mark.parametrize("store_type", STORES)
def test_a_batch_whose_reply_was_lost_is_not_counted_twice(redis_url: str,
                                                           store_type: type) -> None:
    client = redis.Redis.from_url(redis_url)
    client.flushdb()
    proxy = LosesOneReply(urlsplit(redis_url).port or 6379)
    config = TelemetryConfig(flush_interval_s=0.02, refresh_interval_s=0.1,
                             socket_timeout_s=0.5)
    store = store_type(f"redis://127.0.0.1:{proxy.port}/0", config).start()
    try:
        for _ in range(7):
            store.record(record("eagle", "eagle", 3, 3.0, 0.02))
        wait_for(lambda: store.flushed == 7)
        assert proxy.lost.is_set() and store.redis_errors >= 1  # the first reply was lost
        assert store.replayed == 1  # ... and the batch sent again was found applied
        entries, requests = _counts(client, store)
        assert entries == 7 and requests == pytest.approx(7, rel=0.05)  # decayed a little; twice: 14
    finally:
        store.stop()
        proxy.close()
        client.close()
