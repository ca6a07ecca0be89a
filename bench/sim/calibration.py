"""Ground truth for the simulator, derived from published tables (sources in docs/POLICY.md).

Acceptance. EAGLE-2 (arXiv 2406.16858) and EAGLE-3 (arXiv 2503.01840) Table 1 give, per
method on Vicuna-13B, speedup S and tokens per cycle tau at T0 and T1. The simulator's
per-token acceptance is `a = invert_accept_length(tau, k_paper)`; classes map to columns:
code <- HumanEval, chat <- MT-bench, structured <- CNN/DM (JSON extraction is
input-grounded: it copies spans of the prompt). Medusa, Lookahead, prompt lookup and the
68M draft model have T0 rows only; their T1 `a` is scaled by EAGLE-2's T1/T0 ratio for the
same column (an assumption). "tlow" is the mean of T0 and T1.

k_paper (draft depth) is an assumption where the papers use trees: EAGLE 5, EAGLE-2 6,
EAGLE-3 8 (tau 7.54 needs k >= 7), Medusa 5 heads, Lookahead 4 (N = 5), prompt lookup 10
(transformers' default `prompt_lookup_num_tokens`), draft model 4.

Step time. A verify step with k drafts at per-worker batch b costs
`plain(b) * (1 + lambda(b) k) + c * k * plain(1)`: verifying k more tokens per sequence
costs more as the batch grows (lambda), drafting costs c plain steps per token whatever
the batch (the draft head or model is small). c per method from Table 1 at T0:
(tau / S - 1) / k_paper, averaged over the three columns (batch 1, where lambda = 0).

Load. The serving-engine speedups at batch b >= 2 come from EAGLE-3's SGLang Table 3
(EAGLE-3 and EAGLE-1 rows) and vLLM Table 5 (EAGLE-3 1.75 -> 1.01, EAGLE-1 1.30 -> 0.71
from batch 2 to 56, linear in between), taken as absolute: lambda(b) is chosen so the
reference method at its k_paper and its Table 1 tau reproduces the table's speedup S(b),
lambda(b) = (tau_ref / S(b) - 1 - c_ref k_ref plain(1) / plain(b)) / k_ref. tau_ref:
EAGLE-3 LLaMA-3.1-8B MT-bench T0 6.13 (Table 3's model); EAGLE-1 Vicuna-13B MT-bench T0
3.98 (no LLaMA-3.1 row). lambda rises linearly from 0 at batch 1 (Table 1's setting) to
its batch-2 value and stays flat past the table's last batch. Plain step time grows as
(1 + b / 48) (an assumption: decoding turns compute-bound around a batch of 48; only
absolute tokens/s depend on it).

vLLM's draft-model and n-gram curves come from the vLLM blog (2024-10-17): speedups at
QPS 1 and at high QPS, read as batch 2 and batch 56 (Table 5's range; the blog gives no
batch sizes — an assumption), taken as absolute like Table 5 with tau_ref from Table 1
(draft model 68M on MT-bench for ShareGPT, 2.27; prompt lookup on CNN/DM, 2.50). The
blog's n-gram 2.8x at QPS 1 exceeds that tau, so no verify overhead can reproduce it; it
is capped at prompt lookup's Table 1 speedup (2.42, i.e. no overhead at batch 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache, lru_cache

import numpy as np

from policies.acceptance import expected_accept_length, invert_accept_length

COLUMNS = {"chat": 0, "code": 1, "structured": 2}  # MT-bench, HumanEval, CNN/DM

# (speedup, tau) per column (MT, HumanEval, CNN/DM), Vicuna-13B, Table 1 (figures copied in docs/POLICY.md).
TABLE1: dict[tuple[str, str], tuple[tuple[float, float], ...]] = {
    ("eagle", "t0"): ((3.07, 3.98), (3.58, 4.39), (2.49, 3.52)),
    ("eagle", "t1"): ((2.32, 3.20), (2.65, 3.63), (2.23, 3.26)),
    ("eagle2", "t0"): ((4.26, 4.83), (4.96, 5.41), (3.40, 4.21)),
    ("eagle2", "t1"): ((3.80, 4.40), (4.22, 4.89), (3.25, 3.97)),
    ("eagle3", "t0"): ((5.58, 6.65), (6.47, 7.54), (5.01, 6.47)),
    ("eagle3", "t1"): ((4.57, 5.42), (5.15, 6.22), (4.33, 5.72)),
    ("medusa", "t0"): ((2.07, 2.59), (2.50, 2.78), (1.71, 2.09)),
    ("lookahead", "t0"): ((1.65, 1.69), (1.71, 1.75), (1.46, 1.50)),
    ("ngram", "t0"): ((1.58, 1.63), (1.85, 1.93), (2.42, 2.50)),  # prompt lookup
    ("draft", "t0"): ((1.93, 2.27), (2.23, 2.57), (1.93, 2.33)),  # 68M draft model
}
PAPER_K = {"eagle": 5, "eagle2": 6, "eagle3": 8, "medusa": 5, "lookahead": 4, "ngram": 10,
           "draft": 4}
METHODS = tuple(PAPER_K)

# Speedup vs batch size: EAGLE-3 paper Table 3 (SGLang, H100, LLaMA-3.1-8B) and Table 5 (vLLM).
SGLANG_BATCH = (2, 4, 8, 16, 24, 32, 48, 56, 64)
SGLANG_EAGLE3 = (1.81, 1.82, 1.62, 1.48, 1.39, 1.32, 1.38, 1.34, 1.38)
SGLANG_EAGLE1 = (1.40, 1.38, 1.23, 1.02, 0.93, 0.94, 0.88, 0.99, 0.99)
VLLM_BATCH = (2, 56)
VLLM_EAGLE3 = (1.75, 1.01)
VLLM_EAGLE1 = (1.30, 0.71)
# vLLM blog (2024-10-17): a draft model goes from 1.5x faster at QPS 1 to 1.4x slower at
# high QPS (ShareGPT); n-gram from 2.8x faster to 1.8x slower (CNN/DM). Taken as absolute
# at batch 2 and 56 like Table 5, except n-gram's QPS-1 figure, which exceeds prompt
# lookup's Table 1 tau (2.50) and is capped at its Table 1 speedup (2.42).
VLLM_DRAFT = (1.5, 1.0 / 1.4)  # reference: Table 1 draft model 68M, MT-bench (tau 2.27)
VLLM_NGRAM = (2.42, 1.0 / 1.8)  # reference: Table 1 prompt lookup, CNN/DM (tau 2.50)
LOAD_CURVES = {  # name -> (batch sizes, speedups, tau_ref, reference method)
    "sglang-eagle3": (SGLANG_BATCH, SGLANG_EAGLE3, 6.13, "eagle3"),
    "sglang-eagle1": (SGLANG_BATCH, SGLANG_EAGLE1, 3.98, "eagle"),
    "vllm-eagle3": (VLLM_BATCH, VLLM_EAGLE3, 6.13, "eagle3"),
    "vllm-eagle1": (VLLM_BATCH, VLLM_EAGLE1, 3.98, "eagle"),
    "vllm-draft": (VLLM_BATCH, VLLM_DRAFT, 2.27, "draft"),
    "vllm-ngram": (VLLM_BATCH, VLLM_NGRAM, 2.50, "ngram"),
}
PLAIN_KNEE = 48.0


# The edit class (input-grounded rewrites: proofread, rename; the answer copies the
# prompt). No paper table has it; from this repo's measurements on SmolLM2:
# - text drafters, (tau, k) measured: n-gram greedy 4.46 at k 4 (vLLM CPU through the
#   gateway, 50 requests, docs/results/2026-12-02-vllm.md), sampled (T 0.8) 1.2 at k 6;
#   lookahead 2.9 greedy, 1.3 sampled at k 6, tree depth 3 (the embedded engine bench,
#   docs/results/2026-12-01-engine.md);
# - trained drafters (EAGLE*, Medusa, draft model): the paper's code (HumanEval) tau with
#   its accepted drafts (tau - 1) scaled by EDIT_TRAINED_RATIO, the embedded engine's
#   (edit - 1) / (code - 1) accept length for EAGLE, EAGLE-2 and Medusa (T 0: 0.57, 0.58,
#   0.50; T 0.8: 0.50, 0.50, 0.75; means), at the paper's depth.
TASKS = ("chat", "code", "structured", "edit")
EDIT_TEXT: dict[tuple[str, str], tuple[float, int]] = {
    ("ngram", "t0"): (4.46, 4), ("ngram", "thigh"): (1.2, 6),
    ("lookahead", "t0"): (2.9, 3), ("lookahead", "thigh"): (1.3, 3)}
EDIT_TRAINED_RATIO = {"t0": 0.551, "thigh": 0.583}


@cache
def class_target(method: str, task: str, bucket: str) -> tuple[float, int]:
    """(tokens per step, draft depth) the world reproduces for the class: the paper's tau
    at its depth, or the edit class's measured figure at the depth it was measured at."""
    if task == "edit" and bucket != "tlow":
        if (method, bucket) in EDIT_TEXT:
            return EDIT_TEXT[(method, bucket)]
        code_bucket = "t0" if bucket == "t0" else "thigh"
        tau = expected_accept_length(true_accept(method, "code", code_bucket), PAPER_K[method])
        return 1.0 + (tau - 1.0) * EDIT_TRAINED_RATIO[bucket], PAPER_K[method]
    return expected_accept_length(true_accept(method, task, bucket), PAPER_K[method]), \
        PAPER_K[method]


@cache
def true_accept(method: str, task: str, bucket: str) -> float:
    """Per-token acceptance a for (method, task class, temperature bucket)."""
    if bucket == "tlow":
        return 0.5 * (true_accept(method, task, "t0") + true_accept(method, task, "thigh"))
    if task == "edit":
        tau, depth = class_target(method, task, bucket)
        a = invert_accept_length(tau, depth)  # the i.i.d. a reproducing it at its depth
        return a
    column = COLUMNS[task]
    a0 = invert_accept_length(TABLE1[(method, "t0")][column][1], PAPER_K[method])
    if bucket == "t0":
        return a0
    if (method, "t1") in TABLE1:
        return invert_accept_length(TABLE1[(method, "t1")][column][1], PAPER_K[method])
    e2_t0 = invert_accept_length(TABLE1[("eagle2", "t0")][column][1], PAPER_K["eagle2"])
    e2_t1 = invert_accept_length(TABLE1[("eagle2", "t1")][column][1], PAPER_K["eagle2"])
    return a0 * e2_t1 / e2_t0


@cache
def draft_cost(method: str) -> float:
    """c: extra plain-step fraction per drafted token at batch 1 (from tau / S at T0)."""
    rows = TABLE1[(method, "t0")]
    return float(np.mean([(tau / s - 1.0) / PAPER_K[method] for s, tau in rows]))


@dataclass(frozen=True, slots=True)
class LoadCurve:
    """lambda(b): the per-draft-token verify overhead at batch b (see module docstring)."""

    name: str

    def overhead_per_token(self, batch: float) -> float:
        return _overhead(self.name, round(batch, 2))


@lru_cache(maxsize=4096)
def _overhead(name: str, batch: float) -> float:
    sizes, speedups, tau_ref, reference = LOAD_CURVES[name]
    k_ref = PAPER_K[reference]

    def at(b: float) -> float:
        s_b = float(np.interp(b, sizes, speedups))
        drafting = draft_cost(reference) * k_ref * plain_step_s(1, 1.0) / plain_step_s(b, 1.0)
        return max(tau_ref / s_b - 1.0 - drafting, 0.0) / k_ref

    if batch < sizes[0]:
        return at(sizes[0]) * max(batch - 1.0, 0.0) / (sizes[0] - 1.0)
    return at(batch)


def plain_step_s(batch: float, base_step_s: float) -> float:
    return base_step_s * (1.0 + batch / PLAIN_KNEE)


def true_step_s(method: str, k: int, batch: float, curve: LoadCurve,
                base_step_s: float) -> float:
    """Seconds per verify step for `method` with k drafts at per-worker batch `batch`."""
    plain = plain_step_s(batch, base_step_s)
    if k <= 0 or method == "plain":
        return plain
    drafting = draft_cost(method) * k * plain_step_s(1, base_step_s)
    return plain * (1.0 + curve.overhead_per_token(batch) * k) + drafting


# --- Departures from the policy's model (bench/sim/world.py) ---------------------------
# Measured with `python -m bench.sim.calibrate` (docs/POLICY.md "World calibration" has
# the run, its setup and its limits).
# Between-prompt std of logit(a), split-half, pooled over the six (task, T) classes, 8
# prompts each, k = 4. EAGLE-3 (not in the engine): the trained drafters' mean.
PROMPT_LOGIT_STD: dict[str, float] = {
    "ngram": 0.725, "lookahead": 0.505, "medusa": 0.338, "eagle": 0.510, "eagle2": 0.250,
    "draft": 0.273, "eagle3": 0.343}
# Within-class correlation of per-prompt logit(a) between a text drafter (n-gram,
# lookahead) and a trained one (Medusa, EAGLE, EAGLE-2, draft): mean of the 8 pairs
# (-0.21 .. 0.59). The world puts correlation 1 inside each family (measured: n-gram ~
# lookahead 0.65; trained pairs -0.18 .. 0.37): a simplification.
FAMILY_CORRELATION = 0.158
# Rejection rate's growth per draft position, (1 - p_last) / (1 - p_first) to the
# 1 / (positions - 1), from the conditional acceptance per position at k = 8. Below 1:
# accepted runs are correlated (a step that has accepted keeps accepting) — this pools
# prompts, so part of it is prompt heterogeneity, which PROMPT_LOGIT_STD draws again.
# EAGLE-3: EAGLE's (the same kind of chain head; an assumption).
REJECT_GROWTH: dict[str, float] = {
    "ngram": 0.674, "lookahead": 0.656, "medusa": 1.121, "eagle": 0.785, "eagle2": 1.016,
    "draft": 0.797, "eagle3": 0.785}
# Tree drafters spend k on tree nodes; accept length stops at the tree's depth (the
# paper's draft depth, PAPER_K).
PAPER_TREE_DEPTH = {m: PAPER_K[m] for m in ("eagle2", "medusa", "lookahead")}
# gateway.classifier.classify on bench/workload.py prompts (200 per class, seed 7): rows
# true task, columns the label. The classifier's own held-out split is near-perfect
# (code 0.998, structured 1.0, chat 0.9915 correct, 2,000 each); the bench prompts are
# phrased unlike its templates ("Show me the code for X." reads as chat), so they are
# the out-of-distribution rate a gateway meets.
# Edits: the classifier's edit rule (gateway/classifier/grounded.py) was not measured on
# bench prompts; assumed right (an edit read as edit, nothing else read as edit).
CLASSIFIER_CONFUSION: dict[str, dict[str, float]] = {
    "code": {"code": 0.655, "structured": 0.0, "chat": 0.345, "edit": 0.0},
    "structured": {"code": 0.0, "structured": 1.0, "chat": 0.0, "edit": 0.0},
    "chat": {"code": 0.0, "structured": 0.0, "chat": 1.0, "edit": 0.0},
    "edit": {"code": 0.0, "structured": 0.0, "chat": 0.0, "edit": 1.0},
}
