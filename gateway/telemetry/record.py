"""The record of one finished request: built once, reported off the response's path.

An `Outcome` is what the gateway saw of a request (what was asked, decided and
answered); `Reporter.record` turns it into one `policies.types.RequestRecord` for the
recorder (Prometheus, the policy's telemetry, tenant metrics), spends the tenant's tokens
and ends the request's trace.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import Tracer

from gateway.config import TenantConfig
from gateway.pools import Pool
from gateway.schemas import GenerationRequest
from gateway.telemetry.prometheus import Recorder
from gateway.telemetry.spans import RequestTrace, Trace
from gateway.telemetry.worker_stats import SpecStats, Usage
from policies.types import Decision, RequestProfile, RequestRecord
from workers.tracer_provider import ListeningTracerProvider

log = logging.getLogger("specroute.gateway")


@dataclass(slots=True)
class Timer:
    """Wall-clock facts of one request, for the telemetry record."""

    start: float = field(default_factory=time.perf_counter)
    first_token: float = 0.0

    def token(self) -> None:
        if not self.first_token:
            self.first_token = time.perf_counter()


@dataclass(frozen=True, slots=True)
class Outcome:
    """One finished request as the gateway saw it. `load`: the pool's outstanding
    requests at dispatch, this one excluded; `workers`: its available workers then."""

    request: GenerationRequest
    profile: RequestProfile
    tenant: TenantConfig
    decision: Decision
    timer: Timer
    load: int = 0
    workers: int = 1
    usage: Usage = field(default_factory=Usage)
    spec: SpecStats = field(default_factory=SpecStats)
    ok: bool = False
    finish_reason: str | None = None


def slo_met(tenant: TenantConfig, ttft_s: float, itl_s: float, e2e_s: float, tokens: int,
            streamed: bool) -> bool:
    """Streaming: TTFT and mean inter-token time within the tenant's targets. Not
    streaming (the client sees only the end): the last token by the deadline a streaming
    client with those targets would have had, ttft + tpot x (tokens - 1)."""
    if streamed:
        return ttft_s * 1000 <= tenant.slo_ttft_ms and itl_s * 1000 <= tenant.slo_tpot_ms
    return e2e_s * 1000 <= tenant.slo_ttft_ms + tenant.slo_tpot_ms * max(tokens - 1, 0)


def verify_steps(spec: SpecStats, k: int, tokens: int) -> int | None:
    """Verify steps behind `tokens`: as reported, or from the reported accept length
    (vLLM reports only its mean), or one per token without speculation; None when a
    speculative worker reported neither, which the policy must not read as anything.

    vLLM counts only the steps that drafted: its per-request `num_spec_steps` is the sum
    of a histogram `observe`d only where the scheduler had draft tokens for the request
    (vllm 0.32 `v1/core/sched/scheduler.py`, `if scheduled_spec_token_ids`; summed in
    `v1/metrics/stats.py` `RequestSpecDecodeMetrics.to_dict`). Prompt lookup finds no
    match on most steps of an open question, so `tokens / num_spec_steps` read 3.5
    tokens a step for chat that vLLM's own mean put at 1.15. Every step emits its
    accepted drafts plus one token, so the steps (prefill included, as SGLang's
    `spec_verify_ct` counts them) are `tokens - accepted drafts`, which is never fewer
    than a consistent engine's count."""
    if tokens <= 0:
        return 0
    if spec.verify_steps > 0:
        if spec.correct_drafts > 0 or spec.proposed_drafts > 0:
            return max(spec.verify_steps, tokens - spec.correct_drafts)
        return spec.verify_steps
    if spec.accept_length > 0:
        return max(round(tokens / spec.accept_length), 1)
    return tokens if k == 0 else None


# A request whose accept length is this many times above or below what its decision
# predicted is flagged (vLLM #44487: users asked for a signal of garbled output or a loop):
# in the record's `extra["anomaly"]`, the span (`specroute.anomaly`), the Prometheus count
# `specroute_acceptance_anomalies_total` and the console's last decisions. Short answers
# say too little to flag.
ANOMALY_RATIO = 3.0
ANOMALY_MIN_TOKENS = 16


def anomaly(predicted: float, observed: float, k: int, tokens: int) -> str | None:
    """Why a speculative request's acceptance is far outside its prediction, else None."""
    if k <= 0 or tokens < ANOMALY_MIN_TOKENS or predicted <= 0.0 or observed <= 0.0:
        return None
    if observed >= predicted * ANOMALY_RATIO:
        return f"accept length {observed:.2f}, {observed / predicted:.1f}x the predicted " \
               f"{predicted:.2f} (a loop or a copied run?)"
    if observed * ANOMALY_RATIO <= predicted:
        return f"accept length {observed:.2f}, 1/{predicted / observed:.1f} of the predicted " \
               f"{predicted:.2f} (garbled or off-distribution output?)"
    return None


def request_record(outcome: Outcome, end: float) -> tuple[RequestRecord, float]:
    """The policy's record of `outcome`, ended at `end` (perf_counter), and its
    end-to-end seconds."""
    request, profile, tenant, decision = (outcome.request, outcome.profile, outcome.tenant,
                                          outcome.decision)
    timer, usage, spec = outcome.timer, outcome.usage, outcome.spec
    e2e = end - timer.start
    tokens = usage.completion_tokens
    steps = verify_steps(spec, decision.k, tokens)
    accept = spec.accept_length or (tokens / steps if steps else 0.0)
    if request.stream:
        ttft = (timer.first_token or end) - timer.start
        itl = (end - timer.first_token) / (tokens - 1) if tokens > 1 and timer.first_token \
            else 0.0
    elif spec.decode_s is not None and tokens > 1:
        ttft = max(e2e - spec.decode_s, 0.0)
        itl = (e2e - ttft) / (tokens - 1)
    else:
        ttft = e2e / max(steps or tokens, 1)
        itl = (e2e - ttft) / (tokens - 1) if tokens > 1 else 0.0
    entry = RequestRecord(
        model=request.model, pool=decision.pool, method=decision.method, k=decision.k,
        task=profile.task, temperature_bucket=profile.temperature_bucket,
        prompt_tokens=usage.prompt_tokens, output_tokens=tokens, verify_steps=steps,
        accept_length=accept, load=outcome.load, ttft_s=ttft, itl_s=itl, e2e_s=e2e,
        tenant=tenant.name, ok=outcome.ok, timestamp=time.time(),
        workers=max(1, outcome.workers),
        pinned=decision.pinned,
        own_draft_tokens=(spec.proposed_drafts / (steps - 1)
                          if spec.batch is not None and steps and steps > 1 else None),
        batch=spec.batch, batch_draft_tokens=spec.batch_draft_tokens,
        accept_scale=decision.accept_scale if decision.k else 1.0,
        slo_met=outcome.ok and slo_met(tenant, ttft, itl, e2e, tokens, request.stream),
        extra={"explored": True} if decision.explored else {},
        accept_histogram=spec.accept_histogram if decision.k else None,
    )
    flagged = anomaly(decision.predicted_accept_length, accept if steps else 0.0,
                      decision.k, tokens)
    if flagged is not None:
        entry.extra["anomaly"] = flagged
    if spec.drafts:  # a hybrid's decode steps and accepted draft tokens per branch
        entry.extra["drafts"] = spec.drafts
    return entry, e2e


class Reporter:
    """Where finished requests go: the recorder, the pools' batch reports, the tenant's
    token count (`spend`) and the request's trace."""

    def __init__(self, recorder: Recorder, pools: dict[str, Pool],
                 spend: Callable[[TenantConfig, int], None], tracer: Tracer,
                 provider: ListeningTracerProvider | None = None) -> None:
        self.recorder = recorder
        self.pools = pools
        self.spend = spend
        self.tracer = tracer
        self.provider = provider  # None: always emit spans
        self._pending: list[tuple[float, Outcome, Trace | None]] = []

    def record(self, outcome: Outcome, trace: Trace | None = None) -> None:
        """Report one finished request to the recorder and end its trace (`trace`; None:
        one span for the whole request, made then).

        Timed now; reported on the event loop's next turn when one is running (every
        request that ended in one turn by one callback, in order), after the
        response's bytes have been flushed (`gateway.http.serve.CoalescingTransport` flushes
        on that turn too, first): Prometheus, the policy feed, token accounting and the
        span never delay the answer. Without a running loop (tests), at once.

        A non-streaming answer arrives whole: its TTFT is the end-to-end time less the decode
        time the worker reported (`SpecStats.decode_s`), else one verify step's share of the
        end-to-end time, prefill then spread over the steps (which reads a request of few
        steps — high acceptance — as slow steps)."""
        end = time.perf_counter()
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._report(end, outcome, trace)
            return
        self._pending.append((end, outcome, trace))
        if len(self._pending) == 1:  # one callback for all the requests that end this turn
            loop.call_soon(self._flush)

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        for end, outcome, trace in pending:
            try:
                self._report(end, outcome, trace)
            except Exception:  # noqa: BLE001 - one bad report must not drop the others
                log.exception("reporting a finished request failed")

    def _report(self, end: float, outcome: Outcome, trace: Trace | None) -> None:
        entry, e2e = request_record(outcome, end)
        self.recorder.record(entry)
        spec, decision, request = outcome.spec, outcome.decision, outcome.request
        if spec.batch is not None and (pool := self.pools.get(decision.pool)) is not None:
            pool.note_batch(spec.batch, time.monotonic())
        self.spend(outcome.tenant, outcome.usage.prompt_tokens + entry.output_tokens)
        if trace is None and (self.provider is None or self.provider.listening):
            trace = RequestTrace(self.tracer, f"specroute {request.endpoint}", None,
                                 start_time=time.time_ns() - int(e2e * 1e9))
        if trace is not None:
            trace.set("specroute.decision_reason", decision.reason)
            if "anomaly" in entry.extra:
                trace.set("specroute.anomaly", entry.extra["anomaly"])
            trace.finish(entry, outcome.finish_reason)
