"""Requests and tokens per minute per tenant, one count for every gateway replica.

Counts live in Redis (`redis_url`) in fixed one-minute windows, keyed by
`policies.keys.limit_window_keys` (requests and tokens), expiring two windows later.
A request is admitted by one Lua script (atomic on the server, so two replicas never
both take the last slot): refused when the tenant's tokens in this window already reach
`rate_limit_tpm`, or its requests reach `rate_limit_rpm`; otherwise its request is
counted. Tokens (prompt + completion, as the worker reported them) are added when the
request ends, so a tenant may overshoot its token limit by what its requests in flight
use; the next request then waits for the next window. A refusal is a 429 with
`Retry-After` (seconds to the window's end).

Without `redis_url` the same windows are counted in this process. When Redis cannot
be reached, `limits.on_redis_error` decides: `open` (the default) counts in this process
instead, so each replica enforces the limit on its own traffic (service goes on, the
limit loosens by the number of replicas); `closed` refuses limited tenants' requests with
a 503 and `Retry-After`. Either way Redis is not asked again for `retry_s`, so a dead
Redis costs one timeout, not one per request. Tenants without limits never touch Redis.

No count is lost without a word (issue 43): what this process counted while Redis was
out (requests admitted, tokens spent) is kept per window and added to Redis when it
answers again, for the windows not yet over; what could not be (its window over) is
dropped. Each failed Redis call, each count kept here and each dropped one is a
Prometheus counter (`LimitsCollector`), and the outage's start and end are warnings,
the end with what was replayed and what was dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterator

from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from gateway.config import TenantConfig
from gateway.errors import LimiterUnavailable, RateLimited
from policies.keys import limit_window_keys

log = logging.getLogger("specroute.gateway")
WINDOW_S = 60

# KEYS: requests, tokens. ARGV: rpm, tpm (0 = no limit), ttl. Returns {verdict, count}:
# 0 admitted (request counted), 1 over rpm, 2 over tpm.
ADMIT_LUA = """
local rpm, tpm = tonumber(ARGV[1]), tonumber(ARGV[2])
if tpm > 0 then
  local tokens = tonumber(redis.call('GET', KEYS[2]) or '0')
  if tokens >= tpm then return {2, tokens} end
end
local n = tonumber(redis.call('GET', KEYS[1]) or '0')
if rpm > 0 and n >= rpm then return {1, n} end
n = redis.call('INCR', KEYS[1])
if n == 1 then redis.call('EXPIRE', KEYS[1], ARGV[3]) end
return {0, n}
"""
SPEND_LUA = """
local n = redis.call('INCRBY', KEYS[1], ARGV[1])
if n == tonumber(ARGV[1]) then redis.call('EXPIRE', KEYS[1], ARGV[2]) end
return n
"""


class LocalCounts:
    """The same fixed windows, in this process."""

    def __init__(self) -> None:
        self.windows: dict[str, tuple[int, int, int]] = {}  # tenant -> (window, req, tok)

    def admit(self, tenant: TenantConfig, window: int) -> int:
        start, requests, tokens = self.windows.get(tenant.name, (window, 0, 0))
        if start != window:
            requests, tokens = 0, 0
        if tenant.rate_limit_tpm and tokens >= tenant.rate_limit_tpm:
            return 2
        if tenant.rate_limit_rpm and requests >= tenant.rate_limit_rpm:
            return 1
        self.windows[tenant.name] = (window, requests + 1, tokens)
        return 0

    def spend(self, tenant: TenantConfig, window: int, tokens: int) -> None:
        start, requests, used = self.windows.get(tenant.name, (window, 0, 0))
        if start != window:
            requests, used = 0, 0
        self.windows[tenant.name] = (window, requests, used + tokens)


class Limits:
    """`admit` before a request runs, `spend` when it ends (see the module docstring)."""

    def __init__(self, redis_url: str | None = None, on_redis_error: str = "open",
                 clock: Callable[[], float] = time.time, retry_s: float = 2.0,
                 timeout_s: float = 0.5,
                 on_limited: Callable[[str, str], None] | None = None) -> None:
        self.on_redis_error = on_redis_error
        self.on_limited = on_limited  # (tenant, code) of each refusal, for metrics
        self.clock = clock
        self.retry_s = retry_s
        self.local = LocalCounts()
        self.redis = None
        self.down_until = 0.0  # monotonic time before which Redis is not asked
        self.pending: set[asyncio.Task] = set()
        self.outage = False  # a Redis call failed and none has succeeded since
        self.errors = {"admit": 0, "spend": 0}  # failed Redis calls, by operation
        self.kept = {"requests": 0, "tokens": 0}  # counted here only, while Redis was out
        self.dropped = {"requests": 0, "tokens": 0}  # never reached Redis: window over
        self.backlog: dict[tuple[str, int, str], int] = {}  # (tenant, window, kind) -> n
        if redis_url:
            import redis.asyncio as aioredis

            self.redis = aioredis.Redis.from_url(redis_url, socket_timeout=timeout_s,
                                                 socket_connect_timeout=timeout_s)
            self.admit_script = self.redis.register_script(ADMIT_LUA)
            self.spend_script = self.redis.register_script(SPEND_LUA)

    async def admit(self, tenant: TenantConfig) -> None:
        """Count one request of `tenant`; raises `RateLimited` (429) when over a limit,
        `LimiterUnavailable` (503) when Redis is down and limits fail closed."""
        if not (tenant.rate_limit_rpm or tenant.rate_limit_tpm):
            return
        now = self.clock()
        window = int(now // WINDOW_S)
        verdict = None
        if self.redis is not None:
            if self._use_redis():
                verdict = await self._redis_admit(tenant, window)
            elif self.on_redis_error == "closed":
                raise self._unavailable(tenant)
        if verdict is None:
            verdict = self.local.admit(tenant, window)
            if self.redis is not None and not verdict:
                self._keep(tenant.name, window, "requests", 1)
        if verdict:
            retry = (window + 1) * WINDOW_S - now
            what = (f"{tenant.rate_limit_rpm} requests" if verdict == 1
                    else f"{tenant.rate_limit_tpm} tokens")
            code = "rate_limit_exceeded" if verdict == 1 else "token_limit_exceeded"
            if self.on_limited is not None:
                self.on_limited(tenant.name, code)
            raise RateLimited(f"Rate limit of {what} per minute reached for tenant "
                              f"'{tenant.name}'; retry in {retry:.0f} s",
                              retry_after_s=retry, code=code)

    def spend(self, tenant: TenantConfig, tokens: int) -> None:
        """Add a finished request's tokens to its window (off the request's path)."""
        if not tenant.rate_limit_tpm or tokens <= 0:
            return
        window = int(self.clock() // WINDOW_S)
        self.local.spend(tenant, window, tokens)  # the fallback stays current either way
        if self._use_redis():
            self._spawn(self._redis_spend(tenant, window, tokens))
        elif self.redis is not None:
            self._keep(tenant.name, window, "tokens", tokens)

    def _spawn(self, work: Coroutine[object, object, None]) -> None:
        task = asyncio.get_running_loop().create_task(work)
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def _keep(self, tenant: str, window: int, kind: str, n: int) -> None:
        """A count made here while Redis was out, for `_replay`."""
        self.kept[kind] += n
        self._requeue((tenant, window, kind), n)

    def _requeue(self, key: tuple[str, int, str], n: int) -> None:
        self.backlog[key] = self.backlog.get(key, 0) + n

    def _use_redis(self) -> bool:
        return self.redis is not None and time.monotonic() >= self.down_until

    async def _redis_admit(self, tenant: TenantConfig, window: int) -> int | None:
        """The verdict from Redis; None to count locally (Redis down, fail open)."""
        requests, tokens = limit_window_keys(tenant.name, window)
        try:
            verdict, _ = await self.admit_script(
                keys=[requests, tokens],
                args=[tenant.rate_limit_rpm, tenant.rate_limit_tpm, 2 * WINDOW_S])
            self._redis_answered()
            return int(verdict)
        except Exception as exc:  # noqa: BLE001 - any Redis failure: degrade, never crash
            self._redis_failed(exc, "admit")
            if self.on_redis_error == "closed":
                raise self._unavailable(tenant) from exc
            return None

    def _unavailable(self, tenant: TenantConfig) -> LimiterUnavailable:
        return LimiterUnavailable(f"rate limits cannot be checked (Redis unavailable) for "
                                  f"tenant '{tenant.name}'", retry_after_s=self.retry_s)

    async def _redis_spend(self, tenant: TenantConfig, window: int, tokens: int) -> None:
        try:
            await self.spend_script(keys=[limit_window_keys(tenant.name, window)[1]],
                                    args=[tokens, 2 * WINDOW_S])
            self._redis_answered()
        except Exception as exc:  # noqa: BLE001 - telemetry of limits: degrade, kept here
            self._redis_failed(exc, "spend")
            self._keep(tenant.name, window, "tokens", tokens)

    def _redis_failed(self, exc: BaseException, operation: str) -> None:
        self.errors[operation] += 1
        if time.monotonic() >= self.down_until:
            log.warning("rate-limit Redis unavailable (%s on %s); limits fail %s for "
                        "%.0f s, counts kept in this process until it answers",
                        type(exc).__name__, operation, self.on_redis_error, self.retry_s)
        self.outage = True
        self.down_until = time.monotonic() + self.retry_s

    def _redis_answered(self) -> None:
        if self.outage:
            self.outage = False
            backlog, self.backlog = self.backlog, {}
            self._spawn(self._replay(backlog))

    async def _replay(self, backlog: dict[tuple[str, int, str], int]) -> None:
        """Add to Redis what this process counted while it was out: the windows not
        over yet; the others are dropped (counted, and said in the log line). Out again
        midway: the rest waits for the next time it answers."""
        current = int(self.clock() // WINDOW_S)
        replayed = {"requests": 0, "tokens": 0}
        for (tenant, window, kind), n in backlog.items():
            if window < current - 1:  # its keys have expired in Redis
                self.dropped[kind] += n
                continue
            if self.outage:
                self._requeue((tenant, window, kind), n)
                continue
            requests, tokens = limit_window_keys(tenant, window)
            try:
                await self.spend_script(keys=[tokens if kind == "tokens" else requests],
                                        args=[n, 2 * WINDOW_S])
                replayed[kind] += n
            except Exception as exc:  # noqa: BLE001 - out again
                self._redis_failed(exc, "spend")
                self._requeue((tenant, window, kind), n)
        log.warning("rate-limit Redis answers again: replayed %d requests and %d tokens "
                    "counted in this process meanwhile; dropped (window over) %d requests "
                    "and %d tokens in all", replayed["requests"], replayed["tokens"],
                    self.dropped["requests"], self.dropped["tokens"])

    async def close(self) -> None:
        if self.pending:
            await asyncio.gather(*self.pending, return_exceptions=True)
        if self.redis is not None:
            await self.redis.aclose()


class LimitsCollector(Collector):
    """`Limits`' Redis failures and the counts they touched, for `/metrics`."""

    def __init__(self, limits: Limits) -> None:
        self.limits = limits

    def collect(self) -> Iterator[CounterMetricFamily]:
        errors = CounterMetricFamily(
            "specroute_rate_limit_redis_errors", "Rate-limit Redis calls that failed",
            labels=["operation"])
        for operation, n in self.limits.errors.items():
            errors.add_metric([operation], n)
        yield errors
        for name, counts, what in (
                ("kept_local", self.limits.kept, "counted in this process while Redis was "
                 "out (added to Redis when it answers)"),
                ("dropped", self.limits.dropped, "counted while Redis was out, their window "
                 "over before it answered: never in the shared count")):
            family = CounterMetricFamily(f"specroute_rate_limit_{name}",
                                         f"Rate-limit counts {what}", labels=["kind"])
            for kind, n in counts.items():
                family.add_metric([kind], n)
            yield family
