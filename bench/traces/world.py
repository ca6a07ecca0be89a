"""The trace world: recorded acceptance replayed for fixed-k pools, costed per step.

A request's recorded trace at k (bench/traces/record.py: per verify step the tokens it
yielded, `accept_lengths[i]`, and the drafts it verified, `drafted[i]`) says, at each
output position p where a step started, how many tokens a step starting there yields:
the run r(p) = accept_lengths[i]. A step that starts inside a recorded step (at p + j,
j < r(p)) is taken to yield the rest of that run, r(p + j) = r(p) - j: the drafts the
recorded step had accepted past p + j stay acceptable when drafted from p + j
(SpecDecode-Bench's per-position acceptance, arXiv 2601.11580, reads its traces the same
way). A fixed-k' pool (k' <= the recorded k) walks the positions: a step at p yields
min(r(p), k' + 1) tokens. The approximation under-counts where the recorded step took
every draft (its run was cut at k, and may have gone on); `cut_check` measures it by
deriving k' = 8 from the k = 16 recording and comparing with the k = 8 one.

Step costs, per world (`LAWS`), for a batch of B requests like this one (the batch is B
copies of the request, as SpecDecode-Bench's simulator duplicates a request per batch):
- `h100`: the paper's H100 Llama-3.1-8B fit (its simulator, `predictor.py` `Llama8BH100`):
  verify forward kv * 3.926e-8 + tokens * 2.101e-5 + 5.886e-3 s with the batch's KV
  tokens and its B * (drafted + 1) tokens; EAGLE's draft kv * 2.378e-9 + tokens *
  8.414e-7 + 2.135e-3 s once per verify step with the batch's KV and k + 1 tokens (as
  the simulator charges it: the longest of the batch's drafts); n-gram's
  draft 0.5875% of the verify forward on a step that drafted; 1.207e-3 s overhead on
  every step, plain's too. A fixed-k EAGLE pool verifies k drafts every step; n-gram
  verifies what it matched (none: 1 token), capped at k.
- `embedded`: the embedded engine's measured step seconds per (method, k, batch)
  (workers/embedded/weights/smollm2-135m-instruct/measured.json, `specroute bench
  batching --write-costs`), read through the policy's own `measured_step_curve` (per
  batch: plain's step plus a line in k); batches past the largest measured (4) are
  extrapolated linearly in the batch from the last two measured — an assumption.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from policies.prior import CurvePoint, Measured, measured_step_curve
from workers.models import WEIGHTS_DIR

DATA = Path(__file__).parent / "data"
MEASURED = WEIGHTS_DIR / "smollm2-135m-instruct" / "measured.json"


@dataclass(frozen=True, slots=True)
class Trace:
    """One request under one method, as recorded."""

    id: str
    category: str
    method: str
    k: int
    prompt_tokens: int
    output_tokens: int
    accept_lengths: tuple[int, ...]
    drafted: tuple[int, ...]
    prefill_ms: float
    model: str = ""

    @classmethod
    def from_row(cls, row: dict) -> Trace:
        return cls(row["id"], row["category"], row["method"], row["k"], row["prompt_tokens"],
                   row["output_tokens"], tuple(row["accept_lengths"]), tuple(row["drafted"]),
                   float(row.get("prefill_ms") or 0.0), row.get("model", ""))


def load_traces(path: Path) -> dict[str, dict[str, Trace]]:
    """id -> method -> trace, from a traces.jsonl (or the folder holding one)."""
    path = path / "traces.jsonl" if path.is_dir() else path
    out: dict[str, dict[str, Trace]] = {}
    with open(path) as handle:
        for line in handle:
            trace = Trace.from_row(json.loads(line))
            out.setdefault(trace.id, {})[trace.method] = trace
    return out


def load_prompts(path: Path) -> dict[str, dict]:
    with open(path) as handle:
        return {item["id"]: item for item in map(json.loads, handle)}


@dataclass(frozen=True, slots=True)
class Walk:
    """What a fixed-k' pool does with a request: per step, the tokens it yields and the
    drafts it verifies."""

    yields: tuple[int, ...]
    drafts: tuple[int, ...]

    @property
    def tokens(self) -> int:
        return sum(self.yields)


def walk(trace: Trace, k: int) -> Walk:
    """The trace replayed at k <= trace.k (module docstring); plain (k 0): one token a step."""
    total = sum(trace.accept_lengths)
    if k <= 0 or trace.method == "plain":
        return Walk((1,) * total, (0,) * total)
    if k > trace.k:
        raise ValueError(f"k {k} is past the recorded k {trace.k}")
    run, draft = [0] * total, [0] * total  # per position: run left, drafts proposed there
    position = 0
    for accepted, drafted in zip(trace.accept_lengths, trace.drafted, strict=True):
        for j in range(accepted):
            run[position + j] = accepted - j
            # inside a run the drafter is still matching: it proposes at least the run's rest
            draft[position + j] = drafted if j == 0 else max(drafted - j, accepted - j - 1)
        position += accepted
    yields, drafts = [], []
    position = 0
    while position < total:
        step = min(run[position], k + 1, total - position)
        proposed = k if trace.method != "ngram" else min(draft[position], k)
        yields.append(step)
        drafts.append(min(max(proposed, step - 1), k))
        position += step
    return Walk(tuple(yields), tuple(drafts))


def cut_check(k8: dict[str, dict[str, Trace]], k16: dict[str, dict[str, Trace]],
              method: str, k: int = 8) -> dict[str, float]:
    """Tokens per step at k derived from the k = 16 recording against the k recording
    itself, over requests whose two outputs have the same length (same continuation)."""
    derived = recorded = steps16 = steps8 = 0
    requests = 0
    for rid, methods in k16.items():
        high, low = methods.get(method), k8.get(rid, {}).get(method)
        if high is None or low is None or low.k != k or high.output_tokens != low.output_tokens:
            continue
        w = walk(high, k)
        derived += w.tokens
        steps16 += len(w.yields)
        recorded += sum(low.accept_lengths)
        steps8 += len(low.accept_lengths)
        requests += 1
    return {"requests": requests,
            "derived_tokens_per_step": derived / steps16 if steps16 else 0.0,
            "recorded_tokens_per_step": recorded / steps8 if steps8 else 0.0}


# -- step costs ---------------------------------------------------------------------------
class H100:
    """SpecDecode-Bench's Llama-3.1-8B on H100 fit (arXiv 2601.11580; module docstring)."""

    target_kv, target_tokens, target_fixed = 3.92645679e-08, 2.10103129e-05, 5.88590713e-03
    eagle_kv, eagle_tokens, eagle_fixed = 2.37768493e-09, 8.41429603e-07, 2.13526175e-03
    ngram_share = 0.005875
    overhead = 1.20683946e-03

    def step(self, method: str, k: int, batch: int, kv: int, drafted: int) -> float:
        verify = (batch * kv * self.target_kv + batch * (drafted + 1) * self.target_tokens
                  + self.target_fixed)
        if method == "eagle" and k > 0:
            # the simulator's `predict_draft_time`: the batch's KV, one request's k + 1
            draft = batch * kv * self.eagle_kv + (k + 1) * self.eagle_tokens + self.eagle_fixed
        elif method == "ngram" and drafted > 0:
            draft = verify * self.ngram_share
        else:
            draft = 0.0
        return verify + draft + self.overhead


class Embedded:
    """The embedded engine's measured step curve (module docstring)."""

    def __init__(self, measured: Measured) -> None:
        self.unit = next(c.step_s for c in measured.costs
                         if c.method == "plain" and c.batch == 1)
        self.curves = {m: measured_step_curve(measured, m) for m in ("ngram", "eagle")}
        self.plain = self.curves["eagle"] or self.curves["ngram"]

    @staticmethod
    def _at(points: tuple[CurvePoint, ...], batch: int) -> tuple[float, float, float]:
        """(base, overhead, per_token) at `batch`: measured, interpolated or extended."""
        for point in points:
            if point.batch == batch:
                return point.base, point.overhead, point.per_token
        below = [p for p in points if p.batch < batch] or list(points[:1])
        above = [p for p in points if p.batch > batch]
        lo, hi = (below[-1], above[0]) if above else (points[-2], points[-1])
        t = (batch - lo.batch) / (hi.batch - lo.batch)
        return tuple(a + (b - a) * t for a, b in (  # type: ignore[return-value]
            (lo.base, hi.base), (lo.overhead, hi.overhead), (lo.per_token, hi.per_token)))

    def step(self, method: str, k: int, batch: int, kv: int, drafted: int) -> float:
        if method == "plain" or k == 0:
            return self.unit * self._at(self.plain, batch)[0]
        base, overhead, per_token = self._at(self.curves[method], batch)
        return self.unit * (base + overhead + per_token * k)


@cache
def embedded_law() -> Embedded:
    with open(MEASURED) as handle:
        return Embedded(Measured.from_dict(json.load(handle)))


LAWS: dict[str, Callable[[], H100 | Embedded]] = {"h100": H100, "embedded": embedded_law}


@dataclass(frozen=True, slots=True)
class Served:
    """A request served by one pool at one batch: decode tokens and seconds (the prefill's
    token and time left out), steps, drafts and accepted drafts."""

    tokens: int
    decode_s: float
    prefill_s: float
    steps: int
    drafted: int
    accepted: int
    # steps by draft tokens accepted (index 0..k): what SGLang's and the embedded worker's
    # `spec_correct_drafts_histogram` report
    histogram: tuple[int, ...] = ()

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.decode_s if self.decode_s else 0.0


def serve(trace: Trace, method: str, k: int, batch: int, law: H100 | Embedded) -> Served:
    """Decode `trace` (recorded with `method` at trace.k >= k) on a fixed-k pool."""
    w = walk(trace, k if method != "plain" else 0)
    seconds, position = 0.0, trace.prompt_tokens + 1
    for tokens, drafted in zip(w.yields, w.drafts, strict=True):
        seconds += law.step(method, k, batch, position, drafted)
        position += tokens
    if isinstance(law, H100):
        prefill = (batch * trace.prompt_tokens * law.target_tokens + law.target_fixed
                   + law.overhead)
    else:
        prefill = trace.prefill_ms / 1000.0
    histogram = [0] * (k + 1 if method != "plain" else 1)
    for tokens in w.yields:
        histogram[tokens - 1] += 1
    return Served(w.tokens, seconds, prefill, len(w.yields), sum(w.drafts),
                  w.tokens - len(w.yields), tuple(histogram))
