"""The fleets the simulator compares routers on: which pools exist, on which workers, at
which k, with which engine's load curves (bench/sim/calibration.py).

Deployable fleets first:
- `sglang-pools` (primary): SGLang 0.5.23 fixes k at launch, so the 12 workers are split
  into pools of one (method, k) each: EAGLE-3 k 3 (4 workers), EAGLE-2 tree of 8 nodes
  (2), n-gram k 4 (2), draft model k 4 (2), plain (2) — a split chosen before any run,
  not tuned. The policy routes between pools and publishes a desired k per pool; a change
  is a relaunch that takes the pool out of service for `relaunch_s` (90 s: SGLang's
  start-up, `SGLANG_RELAUNCH_S`; vLLM's pools 93 s, the drain and relaunch measured on
  this machine, docs/results/2026-12-01-vllm.md), held for
  `relaunch_interval_s` after the previous one (the supervisor's
  `min_relaunch_interval_s`, 30 s). Load curves: EAGLE-3 Table 3 (arXiv 2503.01840).
- `embedded`: the embedded engine serves every method and k per request on every worker
  (`custom_params.method`, `custom_params.num_speculative_tokens`), so 12 workers each
  run EAGLE, EAGLE-2, Medusa, lookahead, prompt lookup, draft model and plain. EAGLE-2
  and Medusa use Table 3's EAGLE-1 row (the same kind of one-layer draft head over the
  target's features); model-free and separate-model drafters the steeper Table 5 curve.
- `vllm`: vLLM 0.33 (eagle, eagle3, ngram, draft_model; k fixed at launch), six pools of
  two workers; Table 5 and the vLLM blog (2024-10-17) curves.
Secondary, not deployable:
- `sglang-shared`: every SGLang method plus Medusa and lookahead on every worker with k
  per request. No engine offers that (SGLang fixes method and k at launch); kept for
  comparison with earlier figures.

Fixed baselines run every (method, k) of the scenario on all 12 workers; the engine
baselines (SGLang's per-server EMA, a vLLM batch-size k table) run on all 12 workers with
the scenario's strongest chain drafter (EAGLE-3 where the scenario has it, else EAGLE).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from bench.sim.relaunch import relaunch_s
from bench.sim.types import SimPool

FLEET_WORKERS = 12
# SGLang start-up before a relaunched server serves again (load weights, capture CUDA
# graphs, start the HTTP server): 1-2 minutes in sglang issue #509; its midpoint.
# read from the repo's records (bench/sim/relaunch.py): SGLang 90 s, vLLM CPU 93 s
SGLANG_RELAUNCH_S = relaunch_s("sglang")
VLLM_RELAUNCH_S = relaunch_s("vllm")  # a vLLM CPU pool's drain + relaunch, measured
Rules = dict[tuple[str, str], tuple[str, "int | None"]]


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fleet: tuple[SimPool, ...]
    curves: dict[str, str]  # method -> load curve, also for the fixed baselines
    rules: Rules  # hand-written (task, bucket) -> (pool, k); bucket "*" = any
    chain_method: str  # the engine baselines' drafter (EAGLE topk = 1)
    deployable: bool = True
    relaunch_s: float = 60.0
    relaunch_interval_s: float = 30.0
    notes: str = ""
    law: str = "sglang-h100"  # the engine's step law (bench/sim/steplaw.py)
    methods: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(dict.fromkeys(
            s.method for s in self.fleet if s.method != "plain" and s.method in self.curves)))

    @property
    def fixed_k(self) -> bool:
        """Some pool fixes k at launch (the relaunch path matters)."""
        return any(not s.per_request_k and s.method != "plain" for s in self.fleet)

    def homogeneous(self, method: str, k: int) -> tuple[SimPool]:
        """All workers running one method at one k (the fixed and engine baselines)."""
        return (SimPool(method, "sglang", method, k, False, FLEET_WORKERS, 12,
                        self.curves.get(method, "sglang-eagle1"), law=self.law),)


def _rules(code: tuple, structured: tuple, chat: tuple, chat_hot: tuple,
           edit: tuple) -> Rules:
    """What an operator would write: code and structured output to the strongest drafter,
    chat to it too except at high temperature (plain or a small k), edits to n-gram."""
    return {("code", "*"): code, ("structured", "*"): structured, ("chat", "*"): chat,
            ("chat", "thigh"): chat_hot, ("edit", "*"): edit}


SGLANG_CURVES = {"eagle3": "sglang-eagle3", "eagle2": "sglang-eagle1", "eagle": "sglang-eagle1",
                 "medusa": "sglang-eagle1", "ngram": "vllm-eagle1", "lookahead": "vllm-eagle1",
                 "draft": "vllm-eagle1", "plain": "sglang-eagle1"}
_SHARED = (("eagle3", 4, 12), ("eagle2", 6, 12), ("eagle", 5, 12), ("medusa", 5, 5),
           ("ngram", 4, 12), ("lookahead", 4, 8), ("draft", 4, 8), ("plain", 0, 0))
SHARED_FLEET = tuple(SimPool(m, "embedded", m, k, True, FLEET_WORKERS, max_k, SGLANG_CURVES[m],
                             law="sglang-h100") for m, k, max_k in _SHARED)
EMBEDDED_FLEET = tuple(replace(s, law="embedded-cpu") for s in SHARED_FLEET
                       if s.method != "eagle3")

_POOLS = (("eagle3-k3", "eagle3", 3, 4), ("eagle2-n8", "eagle2", 8, 2), ("ngram-k4", "ngram", 4, 2),
          ("draft-k4", "draft", 4, 2), ("plain", "plain", 0, 2))
SGLANG_POOLS = Scenario(
    "sglang-pools",
    tuple(SimPool(name, "sglang", method, k, False, workers, 12, SGLANG_CURVES[method],
                  group=name, law="sglang-h100") for name, method, k, workers in _POOLS),
    SGLANG_CURVES,
    _rules(("eagle3-k3", None), ("eagle3-k3", None), ("eagle2-n8", None), ("plain", None),
           ("ngram-k4", None)),
    "eagle3", relaunch_s=SGLANG_RELAUNCH_S,
    notes="SGLang fixed-k pools (EAGLE-3 k3 x4, EAGLE-2 8 nodes x2, n-gram k4 x2, "
          "draft k4 x2, plain x2), relaunch to change k (deployable)")

EMBEDDED = Scenario(
    "embedded", EMBEDDED_FLEET,
    {m: c for m, c in SGLANG_CURVES.items() if m != "eagle3"},
    _rules(("eagle2", None), ("eagle2", None), ("eagle2", None), ("eagle", 2), ("ngram", None)),
    "eagle",
    notes="embedded engine: every method on every worker, k per request (deployable)",
    law="embedded-cpu")

SGLANG_SHARED = Scenario(
    "sglang-shared", SHARED_FLEET, SGLANG_CURVES,
    _rules(("eagle3", None), ("eagle3", None), ("eagle3", None), ("eagle3", 2),
           ("ngram", None)),
    "eagle3", deployable=False,
    notes="every SGLang method on every worker, k per request (NOT deployable: SGLang "
          "fixes method and k at launch)")

VLLM_CURVES = {"eagle3": "vllm-eagle3", "eagle": "vllm-eagle1", "ngram": "vllm-ngram",
               "draft": "vllm-draft", "plain": "vllm-eagle1"}
_VLLM_POOLS = (("plain", "plain", 0), ("eagle3-k2", "eagle3", 2), ("eagle3-k5", "eagle3", 5),
               ("eagle-k3", "eagle", 3), ("ngram-k4", "ngram", 4), ("draft-k3", "draft", 3))
VLLM_MAX_K = {"plain": 0, "eagle3": 8, "eagle": 5, "ngram": 8, "draft": 4}
VLLM_FLEET = tuple(SimPool(name, "vllm", method, k, False, 2, VLLM_MAX_K[method],
                           VLLM_CURVES[method], group=name, law="vllm-h100")
                   for name, method, k in _VLLM_POOLS)

VLLM = Scenario(
    "vllm", VLLM_FLEET, VLLM_CURVES,
    _rules(("eagle3-k5", None), ("eagle3-k5", None), ("eagle3-k2", None), ("plain", None),
           ("ngram-k4", None)),
    "eagle3", relaunch_s=VLLM_RELAUNCH_S,
    notes="vLLM 0.33, six (method, k) pools of 2 workers, relaunch to change k (deployable)",
    law="vllm-h100")

SCENARIOS = {s.name: s for s in (SGLANG_POOLS, EMBEDDED, VLLM, SGLANG_SHARED)}
PRIMARY = "sglang-pools"
PER_REQUEST_K = "embedded"  # the fleet the per-request-k targets are read on
