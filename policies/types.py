"""The values that flow between the gateway and the policy.

`RequestProfile` is what the classifier reads off a request; `PoolView` is what the
gateway knows of a pool right now; `Decision` is what the policy answers; `RequestRecord`
is what the gateway reports when a request ends. Plain dataclasses: no I/O, no imports
from the gateway or the workers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Literal

from policies.request_limits import MAX_K

# `edit`: copy-heavy — rewrite material the request provides (proofread a paragraph,
# rename in a function) or answer from it (summarize, extract, answer from a passage):
# the output reuses the input, which prompt-lookup drafting (n-gram) accepts best — what
# DESIGN.md calls input-grounded. The classifier's text model knows only the first
# three; `edit` comes from rules (gateway/classifier/grounded.py).
Task = Literal["code", "structured", "chat", "edit"]
TASKS: tuple[Task, ...] = ("code", "structured", "chat", "edit")
# The acceptance context of every class at once: where the policy learns per pool, not per
# class (`PolicyConfig.learning_unit` "pool"), the request's prediction tells requests apart
ANY_TASK = "any"


def temperature_bucket(temperature: float) -> str:
    """Coarse temperature classes used as a policy context: greedy, low, high."""
    if temperature <= 1e-5:
        return "t0"
    return "tlow" if temperature < 0.7 else "thigh"


@dataclass(frozen=True, slots=True)
class RequestProfile:
    task: Task
    temperature: float
    top_p: float
    prompt_tokens: int  # estimated at the gateway (no tokenizer there)
    max_tokens: int
    stream: bool
    tenant: str = "default"
    model: str = ""
    needs_constrained: bool = False  # response_format json_schema / regex
    needs_tools: bool = False
    reasons: tuple[str, ...] = ()  # which rules fired, for /v1/routing/explain
    # The per-request drafter predictor (policies/predictor.py), sorted by family: the
    # predicted accept length per family, and the quantised scale of its extra tokens per
    # step against the class's mean, which the policy applies to the acceptance it
    # learned for the class (empty: no prediction, scale 1)
    predicted_accept: tuple[tuple[str, float], ...] = ()
    drafter_scales: tuple[tuple[str, float], ...] = ()
    # the same scale against the mean of every request (not the class's): what the policy
    # applies where it learns one acceptance per pool (`PolicyConfig.learning_unit`)
    pooled_scales: tuple[tuple[str, float], ...] = ()

    @property
    def temperature_bucket(self) -> str:
        return temperature_bucket(self.temperature)

    def to_dict(self) -> dict:
        out = asdict(self)
        out["temperature_bucket"] = self.temperature_bucket
        out["reasons"] = list(self.reasons)
        del out["predicted_accept"], out["drafter_scales"], out["pooled_scales"]
        out["predicted"] = {"accept_length": dict(self.predicted_accept),
                            "scale": dict(self.drafter_scales),
                            "pooled_scale": dict(self.pooled_scales)}
        return out


@dataclass(frozen=True, slots=True)
class PoolView:
    name: str
    engine: str  # "sglang" | "vllm" | "openai" | "embedded"
    method: str  # a policies.methods.Method value (or a custom engine name)
    k: int  # configured speculative tokens; 0 = plain
    per_request_k: bool
    healthy_workers: int
    outstanding: int  # requests in flight across the pool's workers
    max_k: int = MAX_K
    # the batch per worker its workers reported on this gateway's latest answers, fading
    # to 1 over seconds (0: none lately): other gateways' traffic in it, which
    # `outstanding` misses
    reported_batch: float = 0.0


@dataclass(frozen=True, slots=True)
class Decision:
    pool: str
    method: str
    k: int
    reason: str
    predicted_accept_length: float = 1.0
    predicted_tokens_per_s: float = 0.0
    explored: bool = False
    fallbacks: tuple[str, ...] = ()  # next-best pools, in order, for failover
    pinned: bool = False  # forced or marked by request headers: a benchmark, never teaches
    # the request's predicted scale the policy applied to the chosen pool's acceptance
    # (policies.predictor): the record carries it so learning can divide it out
    accept_scale: float = 1.0

    def to_dict(self) -> dict:
        out = asdict(self)
        out["fallbacks"] = list(self.fallbacks)
        return out


@dataclass(slots=True)
class RequestRecord:
    """One finished request, as the telemetry store keeps it.

    `verify_steps` is None when the worker did not say how many verify steps it took
    (an OpenAI-compatible upstream without speculation counters): such a request counts
    as traffic, never for acceptance or step cost — unknown is not "all accepted". A
    `pinned` record (benchmark traffic) goes to the stream and metrics, never to the
    aggregates the policy learns from."""

    model: str
    pool: str
    method: str
    k: int
    task: str
    temperature_bucket: str
    prompt_tokens: int
    output_tokens: int
    verify_steps: int | None  # None: the upstream reported no speculation counters
    accept_length: float
    load: int  # outstanding requests on the pool at dispatch
    ttft_s: float
    itl_s: float  # mean inter-token latency
    e2e_s: float
    tenant: str = "default"
    slo_met: bool = True
    ok: bool = True
    timestamp: float = 0.0
    workers: int = 1  # healthy workers in the pool at dispatch (load / workers = batch per worker)
    pinned: bool = False  # pool or k pinned, or marked benchmark: kept out of learning
    # What the worker saw over this request's decode steps, when it says (the embedded
    # worker does; SGLang and vLLM do not): the mean number of requests in its batch, and
    # the mean draft tokens verified per step across that batch (every request's, this
    # one's included). The gateway's own count (`load`) misses other gateways' traffic.
    batch: float | None = None
    batch_draft_tokens: float | None = None
    # this request's own draft tokens verified per decode step (its proposed drafts over
    # its steps after the first), where the worker counted them: prompt lookup proposes
    # fewer than its k when it finds no match, so the batch's draft tokens compare with
    # this, not with k
    own_draft_tokens: float | None = None
    # the predicted scale its decision applied (`Decision.accept_scale`): the aggregates
    # learn the class's acceptance with it divided out (`aggregates.record_values`)
    accept_scale: float = 1.0
    extra: dict = field(default_factory=dict)
    # decode verify steps by the draft tokens each accepted (index 0..k), where the worker
    # counted them (SGLang's `spec_correct_drafts_histogram`, the embedded worker's):
    # the accept length at any k' below the run's k follows from it exactly
    # (policies/accept_curve.py)
    accept_histogram: tuple[int, ...] | None = None

    def to_dict(self) -> dict:
        return asdict(self)
