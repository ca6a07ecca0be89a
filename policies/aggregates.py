"""Time-decayed per-context aggregates that many writers can add to without coordination.

A context is (model, pool, method, k, task, temperature bucket, load bucket). Each
finished request adds to a handful of sums (requests, verify steps, output tokens, decode
seconds, load, how far the batch's draft tokens per request were from the request's own
k; `known` counts the requests whose verify steps the worker reported, the only ones
behind steps, tokens, decode seconds and batch draft tokens). Old observations fade with time constant `tau`.

Forward decay (Cormode et al., "Forward Decay", ICDE 2009): a contribution x at time t is
stored as x * exp((t - L) / tau) for a landmark L, and read at time `now` as
stored * exp(-(now - L) / tau). Additions commute, so two gateways can HINCRBYFLOAT into
one Redis hash and agree. Landmarks advance in eras of `ERA_TAUS * tau` so the stored
weights stay below e^ERA_TAUS; fields carry their era ("{era}:{name}") and eras older
than the previous one (weight < e^-ERA_TAUS) are dropped. The same sums are also kept
with a 5x shorter time constant (fields "f{era}:{name}"): the learner compares the two
to notice a drift (a new checkpoint, a new traffic mix) faster than `tau` allows.
One field is never decayed: "all:known", the requests with reported verify steps the
context has ever had, which the learner weighs the workers' prior against (a prior is
what was known before any traffic: the clock must not hand it back its weight).
"""

from __future__ import annotations

import functools
import math
import threading
from collections import deque
from dataclasses import dataclass

from policies.types import ANY_TASK, RequestRecord

DECAY_TAU_S = 300.0  # default decay time constant; the gateway's policy.decay_tau_s
ERA_TAUS = 8.0
FIELDS = ("n", "known", "steps", "tokens", "decode_s", "load", "batch_dk")
# decode verify steps by draft tokens accepted (`RequestRecord.accept_histogram`), one
# field per count, "h0".."h{HISTOGRAM_BINS - 1}"; a longer run is counted in the last
HISTOGRAM_BINS = 33
HISTOGRAM_FIELDS = tuple(f"h{i}" for i in range(HISTOGRAM_BINS))
RECENT_FRACTION = 0.2  # the recent view decays 5x faster, to notice drift (prefix "f")
RECENT_PREFIX = "f"
LIFETIME_FIELD = "all:known"  # never decayed, never dropped
LOAD_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 48, 64, 96, 128)


def load_bucket(load_per_worker: float) -> int:
    """The largest bucket edge <= load (coarse batch-size slots, like SGLang's tiers)."""
    edge = 0
    for b in LOAD_BUCKETS:
        if load_per_worker >= b:
            edge = b
    return edge


@dataclass(frozen=True, slots=True)
class ContextKey:
    model: str
    pool: str
    method: str
    k: int
    task: str
    temperature_bucket: str
    load_bucket: int

    def encode(self) -> str:
        return "|".join((self.model, self.pool, self.method, str(self.k), self.task,
                         self.temperature_bucket, str(self.load_bucket)))

    @classmethod
    def decode(cls, text: str) -> ContextKey:
        model, pool, method, k, task, bucket, load = text.split("|")
        return cls(model, pool, method, int(k), task, bucket, int(load))

    def accept_key(self, pooled: bool = False) -> tuple[str, str, str, str]:
        """The acceptance context it adds to (policies.prior.AcceptKey): its class's, or
        with `pooled` (`PolicyConfig.learning_unit` "pool") every class's at once."""
        return (self.model, self.method, ANY_TASK if pooled else self.task,
                self.temperature_bucket)

    @classmethod
    def of(cls, rec: RequestRecord) -> ContextKey:
        per_worker = (rec.load + 1) / max(rec.workers, 1)
        return cls(rec.model, rec.pool, rec.method, int(rec.k), rec.task,
                   rec.temperature_bucket, load_bucket(per_worker))


@dataclass(frozen=True, slots=True)
class ContextStats:
    """Decayed sums for one context at read time."""

    n: float = 0.0  # every request: traffic
    known: float = 0.0  # requests with reported verify steps: behind the sums below
    steps: float = 0.0
    tokens: float = 0.0
    decode_s: float = 0.0
    load: float = 0.0
    # sum over `known` requests of (their batch's draft tokens per request - own k): 0, the
    # request's own k, where the worker did not say (and in sums written before the field)
    batch_dk: float = 0.0
    recent: ContextStats | None = None  # the same sums with the short time constant
    # decayed decode steps by draft tokens accepted (index), where workers counted them
    histogram: tuple[float, ...] = ()
    # requests with reported steps ever (not decayed; 0 in hashes written before the field)
    lifetime_known: float = 0.0

    @property
    def evidence(self) -> float:
        """Requests behind the acceptance, for weighing the prior: the undecayed count."""
        return max(self.lifetime_known, self.known)

    @property
    def accept_length(self) -> float:
        return self.tokens / self.steps if self.steps > 0 else 1.0

    @property
    def step_s(self) -> float:
        """Seconds per verify step after the first (whose time is inside TTFT)."""
        decode_steps = self.steps - self.known
        return self.decode_s / decode_steps if decode_steps > 0 else 0.0

    @property
    def mean_load(self) -> float:
        return self.load / self.n if self.n > 0 else 0.0

    @property
    def mean_batch_dk(self) -> float:
        """Draft tokens verified per request per step in the batches these requests rode,
        less their own k (the context's): 0 where the worker did not say."""
        return self.batch_dk / self.known if self.known > 0 else 0.0


def batch_dk(rec: RequestRecord) -> float:
    """How many more draft tokens per step the request's batch verified per request than
    the request itself, as its worker reported them: the batch's mean less the request's
    own drafts per step (less its k where those are not known); 0 without a report (a
    batch of its like: what the cost model assumed before workers said). Added to the
    context's k it gives the batch's draft tokens in the terms of k, which is what the
    policy predicts with — prompt lookup at k = 6 verifies about one token a step."""
    if rec.batch_draft_tokens is None or rec.batch is None or rec.batch < 1.0:
        return 0.0
    own = rec.own_draft_tokens if rec.own_draft_tokens is not None else float(rec.k)
    return max(rec.batch_draft_tokens, 0.0) / rec.batch - own


def steps_known(rec: RequestRecord) -> bool:
    """Whether the record says how many verify steps its output took. None, or 0 steps
    for a non-empty output, means the worker did not report it."""
    return rec.verify_steps is not None and (rec.verify_steps > 0 or rec.output_tokens == 0)


def teaches(rec: RequestRecord) -> bool:
    """Whether the policy may learn from the record: not pinned benchmark traffic, which
    would give it exploration production never has."""
    return not rec.pinned


def class_tokens(rec: RequestRecord) -> float:
    """The output tokens the request's verify steps would have yielded at its class's
    acceptance: a request the policy sent with a predicted scale s
    (`RequestRecord.accept_scale`: its extra tokens per step predicted s times its
    class's) counts its extra tokens (those beyond one a step) divided by s. A pool fed
    the requests the predictor scaled up so learns its class's acceptance, not one the
    choice inflated (which the next request's scale would inflate again). Steps and decode
    time stay as measured: the step cost is the pool's, whatever the request."""
    tokens, steps = float(rec.output_tokens), float(rec.verify_steps or 0)
    if rec.accept_scale == 1.0 or rec.accept_scale <= 0.0 or tokens <= steps:
        return tokens
    return steps + (tokens - steps) / rec.accept_scale


def record_values(rec: RequestRecord) -> dict[str, float]:
    """The sums one request contributes; decode time excludes time to first token, and load
    counts the request itself (the batch it joined), as `Policy.decide` does. A request
    without reported verify steps adds only to the traffic sums (`n`, `load`)."""
    load = (rec.load + 1) / max(rec.workers, 1)
    if not steps_known(rec):
        return {"n": 1.0, "load": load}
    return {"n": 1.0, "known": 1.0, "steps": float(rec.verify_steps or 0),
            "tokens": class_tokens(rec),
            "decode_s": max(rec.e2e_s - rec.ttft_s, 0.0), "load": load,
            "batch_dk": batch_dk(rec), **histogram_values(rec.accept_histogram)}


def histogram_values(histogram: tuple[int, ...] | None) -> dict[str, float]:
    """The histogram's fields ("h{accepted}" -> steps), runs past the last bin in it."""
    out: dict[str, float] = {}
    for accepted, steps in enumerate(histogram or ()):
        if steps > 0:
            name = HISTOGRAM_FIELDS[min(accepted, HISTOGRAM_BINS - 1)]
            out[name] = out.get(name, 0.0) + float(steps)
    return out


def era_of(t: float, tau: float) -> int:
    return int(t // (ERA_TAUS * tau))


def forward_increments(values: dict[str, float], t: float, tau: float) -> dict[str, float]:
    """Field increments ("{era}:{name}", "f{era}:{name}", and the undecayed
    LIFETIME_FIELD -> amount) for one contribution."""
    out: dict[str, float] = {}
    add_forward(out, values, t, tau)
    return out


def add_forward(fields: dict[str, float], values: dict[str, float], t: float,
                tau: float) -> None:
    """Add one contribution's `forward_increments` to `fields`, without building them:
    the same sums, added in the same order (a request's telemetry is folded twice, into
    the process's aggregates and into the batch for Redis, off the event loop but under
    its GIL)."""
    for prefix, view_tau in (("", tau), (RECENT_PREFIX, tau * RECENT_FRACTION)):
        era = era_of(t, view_tau)
        weight = math.exp((t - era * ERA_TAUS * view_tau) / view_tau)
        names = _names(prefix, era)
        for name, value in values.items():  # `record_values`' names: FIELDS, HISTOGRAM_FIELDS
            field = names[name]
            fields[field] = fields.get(field, 0.0) + value * weight
    if values.get("known"):
        fields[LIFETIME_FIELD] = fields.get(LIFETIME_FIELD, 0.0) + values["known"]


@functools.lru_cache(maxsize=64)  # a few eras are live at a time
def _names(prefix: str, era: int) -> dict[str, str]:
    """Each field's name in one era of one view (read only: shared by every caller)."""
    return {name: f"{prefix}{era}:{name}" for name in (*FIELDS, *HISTOGRAM_FIELDS)}


def stale_eras(t: float, tau: float) -> tuple[int, int]:
    """The era before the previous one, in each view (`stale_fields`' key): a context's
    stale fields change only when this does."""
    return era_of(t, tau) - 2, era_of(t, tau * RECENT_FRACTION) - 2


def stale_fields(t: float, tau: float) -> list[str]:
    """Fields of the era before the previous one (both views), safe to delete."""
    return list(stale_of_eras(*stale_eras(t, tau)))


@functools.lru_cache(maxsize=64)  # a few eras are live at a time
def stale_of_eras(old: int, old_recent: int) -> tuple[str, ...]:
    return (*(f"{old}:{name}" for name in (*FIELDS, *HISTOGRAM_FIELDS)),
            *(f"{RECENT_PREFIX}{old_recent}:{name}" for name in (*FIELDS, *HISTOGRAM_FIELDS)))


def _read(fields: dict[str, float], now: float, tau: float, prefix: str) -> dict[str, float]:
    current = era_of(now, tau)
    sums = dict.fromkeys((*FIELDS, *HISTOGRAM_FIELDS), 0.0)
    for field_name, stored in fields.items():
        era_text, _, name = field_name.partition(":")
        if prefix:
            if not era_text.startswith(prefix):
                continue
            era_text = era_text[len(prefix):]
        elif not era_text.lstrip("-").isdigit():
            continue
        era = int(era_text)
        if name not in sums or era < current - 1:
            continue
        sums[name] += stored * math.exp(-(now - era * ERA_TAUS * tau) / tau)
    return sums


def read_stats(fields: dict[str, float], now: float, tau: float) -> ContextStats:
    """Decayed sums at `now` from a hash of forward-decayed fields (both views)."""
    recent = _stats(_read(fields, now, tau * RECENT_FRACTION, RECENT_PREFIX))
    return _stats(_read(fields, now, tau, ""), recent=recent,
                  lifetime_known=float(fields.get(LIFETIME_FIELD, 0.0)))


def _stats(sums: dict[str, float], **more: object) -> ContextStats:
    """ContextStats of `_read`'s sums: the histogram's fields as one tuple, trailing
    empty bins dropped."""
    histogram = [sums.pop(name) for name in HISTOGRAM_FIELDS]
    while histogram and histogram[-1] <= 0.0:
        histogram.pop()
    return ContextStats(**sums, histogram=tuple(histogram), **more)  # type: ignore[arg-type]


class LocalAggregates:
    """The same forward-decayed hashes, held in process (and the fallback when Redis is down)."""

    def __init__(self, tau: float) -> None:
        self.tau = tau
        self._hashes: dict[str, dict[str, float]] = {}
        self._cleaned: dict[str, tuple[int, int]] = {}  # per context, `stale_eras` dropped

    def add(self, rec: RequestRecord, t: float) -> None:
        if not teaches(rec):
            return
        context = ContextKey.of(rec).encode()
        fields = self._hashes.setdefault(context, {})
        add_forward(fields, record_values(rec), t, self.tau)
        stale = stale_eras(t, self.tau)
        if self._cleaned.get(context) != stale:  # gone since the last time: nothing to drop
            self._cleaned[context] = stale
            for name in stale_of_eras(*stale):
                fields.pop(name, None)

    def snapshot(self, now: float) -> dict[str, ContextStats]:
        return {key: read_stats(fields, now, self.tau) for key, fields in self._hashes.items()}


class PendingAggregates:
    """`LocalAggregates` written from the event loop and read from a thread.

    `add` only appends to a deque (atomic, no lock); records are folded into the sums
    (the costly part: every field of the context, decayed) in batches under the lock by
    `fold`, which the store's own thread calls, and by `snapshot` (the learner's thread).
    Nothing is lost: a snapshot first folds in everything added before it. Records must
    carry their timestamp: they may be folded later."""

    MAX_PENDING = 4096  # fold on the caller's thread only if nobody has folded for long

    def __init__(self, tau: float) -> None:
        self._aggregates = LocalAggregates(tau)
        self._lock = threading.Lock()
        self._pending: deque[RequestRecord] = deque()

    @property
    def tau(self) -> float:
        return self._aggregates.tau

    def add(self, rec: RequestRecord) -> None:
        self._pending.append(rec)
        if len(self._pending) > self.MAX_PENDING:
            self.fold()

    def fold(self) -> None:
        with self._lock:
            self._fold()

    def _fold(self) -> None:
        pending, aggregates = self._pending, self._aggregates
        while pending:
            rec = pending.popleft()
            aggregates.add(rec, rec.timestamp)

    def snapshot(self, now: float) -> dict[str, ContextStats]:
        with self._lock:
            self._fold()
            return self._aggregates.snapshot(now)
