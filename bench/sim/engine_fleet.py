"""A homogeneous fleet whose engines choose k themselves, simulated verify step by verify
step: SGLang's `--speculative-adaptive`, vLLM's `num_speculative_tokens_per_batch_size`,
or a fixed k; and in front of it a dispatcher (least loaded, or the gateway's
speculation-aware sharding, bench/sim/sharding.py).

The fluid simulator (bench/sim/simulator.py) draws each request's verify steps at
dispatch, which needs its k fixed for its life. These engines re-choose k per verify
batch for every request in it, from what the previous batches accepted, so here every
step is simulated: the batch is the worker's running requests, k comes from the engine's
controller for that batch size, each request's accepted drafts are drawn from the
world's positional law at its own per-prompt acceptance (bench/sim/world.py), the step
takes the world's step time (bench/sim/steplaw.py) and the controller is fed the batch's
accepted drafts. A request joins at the next step boundary; its first step emits its
first token (prefill's) and drafts nothing.

SGLang 0.5.23 (`sglang/srt/speculative/adaptive_spec_params.py`, read from the wheel):
`DEFAULT_ADAPTIVE_CONFIG` (l. 28-53) tiers by batch size 1: [1, 3, 5, 7] (down
hysteresis -0.25), 8: [0, 1, 3], 32: [0, 1], 64: [0]; `AdaptiveStepSlot` (l. 153-272): EMA
(alpha 0.2) of the batch's mean accepted drafts per request, updated once per verify
batch (`update`, l. 187), not while at 0 steps; 10 warm-up batches, a decision every 5
(l. 205-211); `_recompute_params` (l. 213-261) steps down while the EMA is at most the
previous candidate - 0.5 + down hysteresis (0.5 for a 0 candidate), else up while above
the current - 0.5 + up hysteresis, and from 0 probes the next candidate; one slot per
tier, routed by the largest tier key <= batch (`_find_closest_bs`, l. 356); the slot of
the verify batch's size is fed (`on_verify_complete`, l. 316, called with
`batch_size=len(batch.reqs)` by `managers/scheduler_components/batch_result_processor.py`
l. 804) and the k of the next batch is that of its own size's slot
(`adaptive_runtime_state.py` `activate_step_by_batch`, l. 120). Only EAGLE / EAGLE3 with
topk 1 (`adaptive_unsupported_reason`, l. 56-100). CUDA-graph padding of the batch size
(`_pad_to_cuda_graph_bs`) is not modelled.

vLLM 0.32 (`vllm/config/speculative.py` l. 491, `v1/spec_decode/dynamic/utils.py`
`build_dynamic_sd_schedule_lookup`, `v1/core/sched/scheduler.py` l. 1487): a list of
inclusive (first batch, last batch, k) ranges, expanded into a dense lookup by the number
of scheduled requests; vLLM ships no default table, so the one here is an operator's
(`VLLM_SCHEDULE`), and one read off the launch benchmark (bench/sim/launch.py
`tuned_schedule`).

vLLM 0.32 adaptive verification (`enable_adaptive_verification`, `config/speculative.py`
l. 551-553: "Currently only supported for method=\"dspark\""; the V2 GPU model runner
only, `config/vllm.py` l. 2975-2980), `v1/worker/gpu/spec_decode/adaptive_verification.py`:
every request drafts its `num_speculative_tokens`; each (request, position) slot is
scored by its survival probability, the running product of the drafter's per-position
confidences (`acceptance_estimator.py`: an online logistic fit of the draft logits'
log-odds to the target's verdicts; a trained confidence head on DSpark); the slots are
sorted and the engine verifies the best `B`, `B` maximising (requests sampling + the
top-B scores' sum) / (draft cost at the batch's requests + verify cost at its non-draft
tokens + B) over cost tables profiled at start-up (`get_num_tokens`, l. 282-350;
`_assign_draft_token_budget`, l. 46-72, admits the global top B); confidences are one
step stale and a new request's are 1.0 (`add_request`, `record_confidences`, l. 183-280).
`AdaptiveVerification` below does that with the strongest estimator this world allows:
each request's true per-position acceptance (bench/sim/world.py `position_accept`; the
world has no per-token signal beyond it), and the world's own step law as the cost table.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from bench.sim.simulator import TRAINED_DRAFTERS, Outcome, SimConfig
from bench.sim.steplaw import MODEL_FREE, StepLaw
from bench.sim.types import SimRequest
from bench.sim.world import A_CAP

# sglang 0.5.23 DEFAULT_ADAPTIVE_CONFIG: tier -> (candidate steps, up, down hysteresis)
SGLANG_ADAPTIVE = {1: ((1, 3, 5, 7), 0.0, -0.25), 8: ((0, 1, 3), 0.0, 0.0),
                   32: ((0, 1), 0.0, 0.0), 64: ((0,), 0.0, 0.0)}
# an operator's vLLM table: (first batch, last batch, k), inclusive
VLLM_SCHEDULE = ((1, 8, 4), (9, 32, 2), (33, 64, 1), (65, 1024, 0))


class AdaptiveStepSlot:
    """sglang 0.5.23 `AdaptiveStepSlot`, line for line (EMA alpha 0.2, update interval
    5, warm-up 10, ceiling_coeff 0: the defaults)."""

    def __init__(self, initial_steps: int, candidates: tuple[int, ...], up: float,
                 down: float) -> None:
        self.candidate_steps = sorted(set(candidates))
        self.up_hysteresis, self.down_hysteresis = up, down
        self.ema_alpha, self.update_interval, self.warmup_batches = 0.2, 5, 10
        self.current_steps = (initial_steps if initial_steps in self.candidate_steps
                              else self.candidate_steps[len(self.candidate_steps) // 2])
        self.ema_accept_len = float(self.current_steps - 1)
        self._batch_count = 0

    def update(self, mean_correct_drafts: float) -> None:
        if self.current_steps > 0:
            self.ema_accept_len = ((1 - self.ema_alpha) * self.ema_accept_len
                                   + self.ema_alpha * mean_correct_drafts)
        self._batch_count += 1
        if self._batch_count <= self.warmup_batches:
            return
        if (self._batch_count - self.warmup_batches) % self.update_interval != 0:
            return
        self._recompute()

    def _recompute(self) -> None:
        idx = self.candidate_steps.index(self.current_steps)
        if self.current_steps == 0:
            idx = min(idx + 1, len(self.candidate_steps) - 1)
            target = self.candidate_steps[idx]
            if target > 0 and self.ema_accept_len < 0:
                self.ema_accept_len = float(target - 1)
            self.current_steps = target
            return
        start = idx
        while idx > 0:
            prev = self.candidate_steps[idx - 1]
            if self.ema_accept_len <= (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis:
                idx -= 1
            else:
                break
        if idx == start:
            while (idx < len(self.candidate_steps) - 1 and self.ema_accept_len
                   > self.candidate_steps[idx] - 0.5 + self.up_hysteresis):
                idx += 1
        self.current_steps = self.candidate_steps[idx]


class Controller:
    """How one engine picks k for a verify batch and what it learns from it."""

    def steps(self, batch: int) -> int:
        raise NotImplementedError

    def verified(self, accepted: np.ndarray, batch: int) -> None:
        return None

    def admit(self, survival: np.ndarray, drafting: float, law: StepLaw) -> np.ndarray | None:
        """Drafts verified per request, given each one's survival per position (b, k):
        None verifies all k of every request."""
        return None


@dataclass
class AdaptiveVerification(Controller):
    """vLLM's adaptive verification (module docstring): draft `k` for every request,
    verify the batch's B best (request, position) slots by survival, B maximising
    expected tokens per step time under the step law."""

    k: int

    def steps(self, batch: int) -> int:
        return self.k

    def admit(self, survival: np.ndarray, drafting: float, law: StepLaw) -> np.ndarray:
        b = survival.shape[0]
        scores = np.sort(survival.ravel())[::-1]
        expected = b + np.concatenate(([0.0], np.cumsum(scores)))  # tokens at B = 0..
        cost = law.steps(b, b + np.arange(len(scores) + 1, dtype=float))
        budget = int(np.argmax(expected / (drafting + cost)))
        admitted = np.zeros(survival.size, dtype=bool)
        admitted[np.argsort(-survival.ravel(), kind="stable")[:budget]] = True
        return admitted.reshape(survival.shape).sum(axis=1)


@dataclass
class FixedK(Controller):
    k: int

    def steps(self, batch: int) -> int:
        return self.k


@dataclass
class SGLangAdaptive(Controller):
    """`AdaptiveSpeculativeParams`: one slot per tier, routed by the batch size."""

    initial_steps: int = 3
    tiers: dict = field(default_factory=lambda: dict(SGLANG_ADAPTIVE))
    _slots: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._keys = sorted(self.tiers)
        self._slots = {key: AdaptiveStepSlot(self.initial_steps, *self.tiers[key])
                       for key in self._keys}

    def slot(self, batch: int) -> AdaptiveStepSlot:
        key = max((k for k in self._keys if k <= batch), default=self._keys[0])
        return self._slots[key]

    def steps(self, batch: int) -> int:
        return self.slot(batch).current_steps

    def verified(self, accepted: np.ndarray, batch: int) -> None:
        if len(accepted):
            self.slot(batch).update(float(accepted.mean()))


@dataclass
class BatchSchedule(Controller):
    """vLLM's dense batch-size lookup over inclusive ranges (gaps carry the previous k)."""

    schedule: tuple[tuple[int, int, int], ...] = VLLM_SCHEDULE
    max_k: int = 16

    def steps(self, batch: int) -> int:
        k = 0
        for first, last, value in self.schedule:
            if batch >= first:
                k = value
            if first <= batch <= last:
                break
        return min(k, self.max_k)


def _verify_tokens(w: _Worker, k: int, depth: int, decay: float, drafting: float,
                   law: StepLaw) -> int:
    """Tokens in the verify forward: every request's k drafts plus one, or what the
    controller admits from the confidences the engine holds (`w.admitted`)."""
    b = len(w.index)
    w.admitted = None
    p = np.clip(1.0 - (1.0 - np.array(w.a))[:, None] * decay ** np.arange(depth)[None, :],
                0.0, A_CAP)  # (b, depth)
    p[~np.array(w.verified, dtype=bool)] = 1.0  # a new request's confidence: 1.0
    survival = np.cumprod(p, axis=1)
    survival[np.array(w.fresh, dtype=bool)] = -np.inf  # prefilling: no drafts
    admitted = w.controller.admit(survival, drafting, law)
    if admitted is None:
        return b * (k + 1)
    w.admitted = admitted
    return b + int(admitted.sum())


Dispatch = Callable[[SimRequest, list[int]], int]  # request, running per worker -> worker


def least_loaded(req: SimRequest, loads: list[int]) -> int:
    return min(range(len(loads)), key=lambda i: loads[i])


@dataclass
class _Worker:
    controller: Controller
    index: list[int] = field(default_factory=list)  # request index
    a: list[float] = field(default_factory=list)
    left: list[int] = field(default_factory=list)  # tokens still to emit
    fresh: list[bool] = field(default_factory=list)  # its first step (prefill) is next
    pending: list[tuple[int, float]] = field(default_factory=list)
    step_end: float = math.inf
    k: int = 0
    first_at: dict = field(default_factory=dict)  # request -> its first token's time
    verified: list[bool] = field(default_factory=list)  # verified once (confidence known)
    admitted: np.ndarray | None = None  # drafts verified per request this step

    @property
    def load(self) -> int:
        return len(self.index) + len(self.pending)


def simulate_engine(requests: list[SimRequest], config: SimConfig, method: str,
                    controller: Callable[[], Controller], law: StepLaw, workers: int = 12,
                    dispatch: Dispatch = least_loaded,
                    finished: Callable[[SimRequest, float, int], None] | None = None
                    ) -> list[Outcome]:
    """Serve `requests` on `workers` engines of one method; `finished(req, accept length,
    k last used)` hears of every request as it ends (what the engine reports)."""
    world = config.world
    rng = np.random.default_rng(config.seed + 1)
    decay = world.decay(method)
    fleet = [_Worker(controller()) for _ in range(workers)]
    outcomes: list[Outcome | None] = [None] * len(requests)
    steps_of: dict[int, int] = {}
    base = config.base_step_s

    def start(w: _Worker, now: float) -> None:
        for i, a in w.pending:
            req = requests[i]
            w.index.append(i)
            w.a.append(a)
            w.left.append(req.output_tokens)
            w.fresh.append(True)
            w.verified.append(False)
        w.pending = []
        b = len(w.index)
        if b == 0:
            w.step_end = math.inf
            return
        k = w.controller.steps(b)
        w.k = k
        depth = world.depth(method, k)
        drafting = law.draft(method, depth if k > 0 else 0)
        over = law.overhead if k > 0 and method not in MODEL_FREE else 0.0
        tokens = (_verify_tokens(w, k, depth, decay, drafting + over, law) if depth > 0
                  else b * (k + 1))
        w.step_end = now + base * (law.step(b, tokens) + drafting + over)

    def finish(w: _Worker, now: float) -> None:
        b, k = len(w.index), w.k
        depth = world.depth(method, k) if k > 0 else 0
        fresh = np.array(w.fresh, dtype=bool)
        if depth > 0:
            a = np.array(w.a)[:, None]
            p = np.clip(1.0 - (1.0 - a) * decay ** np.arange(depth)[None, :], 0.0, A_CAP)
            run = np.cumprod(rng.random((b, depth)) < p, axis=1)
            if w.admitted is not None:  # only the verified drafts can be accepted
                run = run * (np.arange(depth)[None, :] < w.admitted[:, None])
            accepted = run.sum(axis=1)
        else:
            accepted = np.zeros(b, dtype=np.int64)
        accepted[fresh] = 0
        w.controller.verified(accepted[~fresh], b)
        keep = []
        for j, i in enumerate(w.index):
            if w.fresh[j]:
                w.first_at[i] = now
            w.left[j] -= int(accepted[j]) + 1
            steps_of[i] = steps_of.get(i, 0) + 1
            if w.left[j] > 0:
                keep.append(j)
                continue
            req = requests[i]
            prefill = req.prompt_tokens * config.prefill_s_per_token
            e2e = prefill + now - req.arrival_s
            tokens = req.output_tokens
            outcomes[i] = Outcome(i, req.phase, req.arrival_s, req.task, req.bucket, method,
                                  k, False, tokens / e2e, e2e, e2e / tokens <= config.slo_itl_s)
            if finished is not None:
                finished(req, tokens / steps_of[i], k)
        w.index = [w.index[j] for j in keep]
        w.a = [w.a[j] for j in keep]
        w.left = [w.left[j] for j in keep]
        w.verified = [w.verified[j] or not w.fresh[j] for j in keep]
        w.fresh = [False for _ in keep]
        start(w, now)

    def run_until(t: float) -> None:
        while True:
            w = min(fleet, key=lambda x: x.step_end)
            if w.step_end > t or w.step_end == math.inf:
                return
            finish(w, w.step_end)

    for req in requests:
        run_until(req.arrival_s)
        scale = (config.phases[req.phase].drafter_scale if method in TRAINED_DRAFTERS
                 else 1.0)
        a = world.prompt_accept(method, req.task, req.bucket, req.z_model, req.z_text, scale)
        w = fleet[dispatch(req, [x.load for x in fleet])]
        w.pending.append((req.index, a))
        if w.step_end == math.inf:
            start(w, req.arrival_s)
    run_until(math.inf)
    return [o for o in outcomes if o is not None]
