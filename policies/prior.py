"""What workers measured about themselves, as the policy's starting point.

The policy may know two things (DESIGN.md): what workers measured about themselves, and
the telemetry of real traffic. This module turns the first into a prior per acceptance
context (model, method, task, temperature bucket), which the learner blends with the
context's own telemetry by request count, so measured traffic takes over.

Two sources:
- embedded workers publish `measured.json` (written by `specroute bench engine
  --write-measured`, served in `/server_info` as `specroute_measured` and in the worker's
  registry entry). Schema:
  `{"model": str, "source": str (the command), "measured_at": ISO date, "device": str,
    "entries": [{"method": str, "k": int, "task": "code"|"structured"|"chat"|"edit",
                 "temperature": float, "accept_length": float, "tokens_per_s": float,
                 "speedup": float (vs plain, same run), "requests": int}]}`
  Acceptance per class: each entry's accept length inverted at its k (arXiv 2211.17192),
  averaged by requests per (task, temperature bucket); a class the run did not cover
  takes the mean of the task's measured buckets, else of the method's entries.
  Relative step cost: tokens/s = accept length / step time, so an entry gives
  step(k) / step(0) = (accept_length / speedup); `per_token_fraction` is
  (step(k) / step(0) - 1) / k, the c of Leviathan et al., averaged over entries.
  Optional `"costs": [{"method": str, "k": int, "batch": int, "step_s": float,
  "steps": int}]`: seconds per decode step with `batch` sequences stepped together, every
  one at the method's `k` (plain: method "plain", k 0), `steps` steps behind the mean
  (`specroute bench batching --write-costs`). `measured_step_curve` turns them into the
  step-cost shape across batch sizes — per batch, plain's step and the slope of the
  method's step over k, both relative to plain's step at batch 1 — which the learner
  starts the pool's cost fit from: a pool's own telemetry rarely varies k enough to
  learn what a draft token costs at each load.
- SGLang pools: `/server_info` `internal_states[].avg_spec_accept_length` at the
  server's `speculative_num_steps`: one method-level value, the same for every class.

No measurement: no prior here; the learner's flat `default_accept`, the same for every
method — never an ordering of methods written by hand.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from policies.acceptance import TEMPERATURE_BUCKETS, invert_method_accept_length
from policies.types import TASKS, temperature_bucket

MEASURED_FILE = "measured.json"
AcceptKey = tuple[str, str, str, str]  # model, method, task, temperature bucket


class MeasuredError(ValueError):
    """A measured document does not follow the schema; the message names the field."""


@dataclass(frozen=True, slots=True)
class MeasuredEntry:
    method: str
    k: int
    task: str
    temperature: float
    accept_length: float
    tokens_per_s: float
    speedup: float
    requests: int

    @property
    def accept(self) -> float:
        """Per-token acceptance behind the accept length at this k."""
        return invert_method_accept_length(self.accept_length, self.method, self.k)


@dataclass(frozen=True, slots=True)
class MeasuredCost:
    method: str
    k: int
    batch: int
    step_s: float
    steps: int


@dataclass(frozen=True, slots=True)
class CurvePoint:
    """Step cost at `batch` sequences per step, relative to plain's step at batch 1:
    step(k) / plain(1) = base + overhead + per_token * k for k >= 1 (`overhead`: what
    drafting costs at any k — a draft head's or draft model's forward, lookahead's
    window), base for plain."""

    batch: float
    base: float
    per_token: float
    overhead: float = 0.0


@dataclass(frozen=True, slots=True)
class Measured:
    model: str
    source: str
    measured_at: str
    device: str
    entries: tuple[MeasuredEntry, ...]
    costs: tuple[MeasuredCost, ...] = ()

    @classmethod
    def from_dict(cls, doc: object) -> Measured:
        if not isinstance(doc, Mapping):
            raise MeasuredError("measured: expected an object")
        head = {name: str(_field(doc, name, str, "measured")) for name in
                ("model", "source", "measured_at", "device")}
        entries = doc.get("entries")
        if not isinstance(entries, list):
            raise MeasuredError("measured.entries: expected a list")
        costs = doc.get("costs", [])
        if not isinstance(costs, list):
            raise MeasuredError("measured.costs: expected a list")
        return cls(**head, entries=tuple(_entry(e, f"measured.entries[{i}]")
                                         for i, e in enumerate(entries)),
                   costs=tuple(_cost(c, f"measured.costs[{i}]") for i, c in enumerate(costs)))

    def to_dict(self) -> dict:
        out = {"model": self.model, "source": self.source, "measured_at": self.measured_at,
               "device": self.device,
               "entries": [{name: getattr(e, name) for name in MeasuredEntry.__slots__}
                           for e in self.entries]}
        if self.costs:
            out["costs"] = [{name: getattr(c, name) for name in MeasuredCost.__slots__}
                            for c in self.costs]
        return out


def read_measured(path: str | Path) -> dict:
    """A measured.json file as published (`WorkerInfo.measured`), checked against the
    schema; MeasuredError says what is wrong with it."""
    try:
        doc = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise MeasuredError(f"{path}: {exc}") from exc
    Measured.from_dict(doc)
    return doc


def _field(doc: Mapping, name: str, kind: type, path: str) -> object:
    value = doc.get(name)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MeasuredError(f"{path}.{name}: expected {kind.__name__}, got {value!r}")
    return value


def _entry(raw: object, path: str) -> MeasuredEntry:
    if not isinstance(raw, Mapping):
        raise MeasuredError(f"{path}: expected an object")
    kinds = {"method": str, "k": int, "task": str, "temperature": float,
             "accept_length": float, "tokens_per_s": float, "speedup": float, "requests": int}
    entry = MeasuredEntry(**{name: _field(raw, name, kind, path)  # type: ignore[arg-type]
                             for name, kind in kinds.items()})
    if entry.task not in TASKS:
        raise MeasuredError(f"{path}.task: must be one of {', '.join(TASKS)}")
    if entry.k < 0 or entry.requests < 0 or entry.accept_length < 1.0 - 1e-9:
        raise MeasuredError(f"{path}: k and requests must be >= 0, accept_length >= 1")
    return entry


def _cost(raw: object, path: str) -> MeasuredCost:
    if not isinstance(raw, Mapping):
        raise MeasuredError(f"{path}: expected an object")
    kinds = {"method": str, "k": int, "batch": int, "step_s": float, "steps": int}
    cost = MeasuredCost(**{name: _field(raw, name, kind, path)  # type: ignore[arg-type]
                           for name, kind in kinds.items()})
    if cost.k < 0 or cost.batch < 1 or cost.steps < 1 or not cost.step_s > 0:
        raise MeasuredError(f"{path}: k must be >= 0, batch and steps >= 1, step_s > 0")
    return cost


def measured_step_curve(measured: Measured, method: str) -> tuple[CurvePoint, ...]:
    """Per batch size measured for both plain and `method`: plain's step, and the
    method's step above it as a line in k over its k >= 1 (overhead + per_token * k,
    least squares weighted by steps, both >= 0; through plain's point when one k was
    measured), relative to plain's step at batch 1. Empty without plain at batch 1 or
    without the method at some k > 0 at a batch where plain was measured."""
    plain: dict[int, list[float]] = defaultdict(lambda: [0.0, 0.0])
    spec: dict[int, list[tuple[int, float, int]]] = defaultdict(list)
    for cost in measured.costs:
        if cost.method == "plain" or cost.k == 0:
            if cost.method in ("plain", method):
                plain[cost.batch][0] += cost.step_s * cost.steps
                plain[cost.batch][1] += cost.steps
        elif cost.method == method:
            spec[cost.batch].append((cost.k, cost.step_s, cost.steps))
    if 1 not in plain:
        return ()
    unit = plain[1][0] / plain[1][1]
    points = []
    for batch in sorted(plain):
        if not spec.get(batch):
            continue
        base = plain[batch][0] / plain[batch][1]
        overhead, per_token = _line([(k, step - base, steps) for k, step, steps in spec[batch]])
        points.append(CurvePoint(float(batch), base / unit, per_token / unit, overhead / unit))
    return tuple(points)


def _line(points: list[tuple[int, float, int]]) -> tuple[float, float]:
    """(intercept, slope) >= 0 of weighted least squares on (k, extra seconds, weight);
    through the origin when the k's do not vary."""
    w = sum(n for _, _, n in points)
    mk = sum(n * k for k, _, n in points) / w
    my = sum(n * y for _, y, n in points) / w
    var = sum(n * (k - mk) ** 2 for k, _, n in points)
    if var <= 1e-12:
        return 0.0, max(my / mk, 0.0) if mk > 0 else 0.0
    slope = sum(n * (k - mk) * (y - my) for k, y, n in points) / var
    if slope < 0:
        return max(my, 0.0), 0.0
    intercept = my - slope * mk
    if intercept < 0:
        through = sum(n * k * y for k, y, n in points) / sum(n * k * k for k, _, n in points)
        return 0.0, max(through, 0.0)
    return intercept, slope


def measured_acceptance(measured: Measured, method: str) -> dict[tuple[str, str], float]:
    """Prior `a` per (task, temperature bucket) for one method, every class filled in;
    empty when the document has no speculative entry for the method."""
    sums: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for entry in measured.entries:
        if entry.method != method or entry.k <= 0:
            continue
        weight = max(entry.requests, 1)
        acc = sums[(entry.task, temperature_bucket(entry.temperature))]
        acc[0] += entry.accept * weight
        acc[1] += weight
    seen = {key: s[0] / s[1] for key, s in sums.items()}
    if not seen:
        return {}
    overall = statistics.fmean(seen.values())
    out: dict[tuple[str, str], float] = {}
    for task in TASKS:
        of_task = [a for (t, _), a in seen.items() if t == task]
        for bucket in TEMPERATURE_BUCKETS:
            out[(task, bucket)] = seen.get((task, bucket),
                                           statistics.fmean(of_task) if of_task else overall)
    return out


def per_token_fraction(measured: Measured, method: str) -> float | None:
    """Extra cost of one drafted token as a fraction of a plain step (c), from the
    entries' accept length and speedup over plain; None without usable entries."""
    fractions = [(e.accept_length / e.speedup - 1.0) / e.k for e in measured.entries
                 if e.method == method and e.k > 0 and e.speedup > 0]
    return max(statistics.fmean(fractions), 0.0) if fractions else None


def method_acceptance(accept_length: float, k: int, method: str = ""
                      ) -> dict[tuple[str, str], float]:
    """A server's single average accept length at its k: the same `a` for every class."""
    if k <= 0 or accept_length <= 0:
        return {}
    a = invert_method_accept_length(accept_length, method, k)
    return {(task, bucket): a for task in TASKS for bucket in TEMPERATURE_BUCKETS}


def keyed(model: str, method: str, per_class: Mapping[tuple[str, str], float]
          ) -> dict[AcceptKey, float]:
    return {(model, method, task, bucket): a for (task, bucket), a in per_class.items()}


@dataclass(frozen=True, slots=True)
class WorkerPrior:
    """One pool's prior: acceptance per context, the relative cost of a drafted token
    (None: unknown, the fleet's fitted cost applies) and, when the workers measured
    batches, the step cost's shape across batch sizes; `source` says where it came from.
    `measured`: the document itself, when there is one, for what reads it per (method, k)
    rather than per method (the fleet planner: `policies/planner/benchmarked.py`)."""

    acceptance: Mapping[AcceptKey, float]
    draft_cost: float | None = None
    source: str = ""
    # the step cost's shape across batch sizes, relative to plain at batch 1 (empty:
    # not measured; then `draft_cost` on the fleet's trend)
    step_curve: tuple[CurvePoint, ...] = ()
    measured: Measured | None = None

    @classmethod
    def from_measured(cls, model: str, method: str, measured: Measured) -> WorkerPrior:
        return cls(keyed(model, method, measured_acceptance(measured, method)),
                   per_token_fraction(measured, method), measured.source,
                   measured_step_curve(measured, method), measured)

    @classmethod
    def from_server_average(cls, model: str, method: str, accept_length: float,
                            k: int) -> WorkerPrior:
        return cls(keyed(model, method, method_acceptance(accept_length, k, method)),
                   source="server avg_spec_accept_length")


def merge(priors: Iterable[Mapping[AcceptKey, float]]) -> dict[AcceptKey, float]:
    """Several workers' priors for the same context: their mean."""
    collected: dict[AcceptKey, list[float]] = defaultdict(list)
    for prior in priors:
        for key, a in prior.items():
            collected[key].append(a)
    return {key: statistics.fmean(values) for key, values in collected.items()}
