"""The fleets the simulator compares routers on: which pools exist, on which workers, at
which k, with which engine's load curves (policies/calibration.py).

- `sglang` (primary): 12 workers each serving every method of the product's GPU config
  (deploy/config.example.yaml: SGLang 0.5.23, EAGLE-3 included) plus Medusa, lookahead
  and prompt lookup, `k` per request; load curves from EAGLE-3 Table 3 (arXiv 2503.01840).
- `vllm`: vLLM 0.33 offers eagle, eagle3, ngram and draft_model, and fixes `k` at launch.
  The 12 workers are split evenly into six pools of two, each one (method, k): plain,
  EAGLE-3 at k 2 and 5, EAGLE at 3, n-gram at 4, draft model at 3. The policy routes
  between pools and publishes a desired `k` per pool; a change is a relaunch that takes
  the pool out of service for `relaunch_s` (60 s) and is held for `relaunch_interval_s`
  after the previous one (the supervisor's `min_relaunch_interval_s`, 30 s). Load curves:
  Table 5 for the EAGLE family, the vLLM blog (2024-10-17) for n-gram and draft model.
- `embedded`: the embedded engine's method set (no EAGLE-3: EAGLE, EAGLE-2, Medusa,
  lookahead, prompt lookup, draft model), `k` per request. EAGLE-2 and Medusa use
  Table 3's EAGLE-1 row: the same kind of one-layer draft head over the target's features
  and tree verification, and Table 3 has no row of their own; model-free and separate-model
  drafters keep the primary's steeper curve.

Fixed baselines run every (method, k) of the scenario on all 12 workers; the oracle knows
the true acceptance and every worker's batch and picks the best pool (and `k`, where the
pool takes `k` per request).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from policies.sim.baselines import SimPool

FLEET_WORKERS = 12


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    fleet: tuple[SimPool, ...]
    curves: dict[str, str]  # method -> load curve, also for the fixed baselines
    static_rules: dict[str, str]  # task -> pool
    per_server_ema: bool = False  # SGLang's --speculative-adaptive exists on this engine
    relaunch_s: float = 60.0
    relaunch_interval_s: float = 30.0
    notes: str = ""
    methods: tuple[str, ...] = field(init=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "methods", tuple(
            s.method for s in self.fleet if s.method != "plain" and s.method in self.curves))

    @property
    def fixed_k(self) -> bool:
        """Some pool fixes k at launch (the relaunch path matters)."""
        return any(not s.per_request_k and s.method != "plain" for s in self.fleet)

    def homogeneous(self, method: str, k: int) -> tuple[SimPool]:
        """All workers running one method at one k (the fixed baselines)."""
        return (SimPool(method, "sglang", method, k, False, FLEET_WORKERS, 12,
                         self.curves.get(method, "sglang-eagle1")),)


SGLANG_CURVES = {"eagle3": "sglang-eagle3", "eagle2": "sglang-eagle1", "eagle": "sglang-eagle1",
                 "medusa": "sglang-eagle1", "ngram": "vllm-eagle1", "lookahead": "vllm-eagle1",
                 "draft": "vllm-eagle1", "plain": "sglang-eagle1"}
_SHARED = (("eagle3", 4, 12), ("eagle2", 6, 12), ("eagle", 5, 12), ("medusa", 5, 5),
           ("ngram", 4, 12), ("lookahead", 4, 8), ("draft", 4, 8), ("plain", 0, 0))
SHARED_FLEET = tuple(SimPool(m, "embedded", m, k, True, FLEET_WORKERS, max_k, SGLANG_CURVES[m])
                     for m, k, max_k in _SHARED)

SGLANG = Scenario(
    "sglang", SHARED_FLEET, SGLANG_CURVES,
    {"code": "eagle3", "structured": "ngram", "chat": "eagle2"}, per_server_ema=True,
    notes="SGLang, every method on every worker, k per request (EAGLE-3 Table 3 curves)")

EMBEDDED = Scenario(
    "embedded", tuple(s for s in SHARED_FLEET if s.method != "eagle3"),
    {m: c for m, c in SGLANG_CURVES.items() if m != "eagle3"},
    {"code": "eagle2", "structured": "ngram", "chat": "eagle2"},
    notes="embedded method set (no EAGLE-3), k per request, SGLang-style curves")

VLLM_CURVES = {"eagle3": "vllm-eagle3", "eagle": "vllm-eagle1", "ngram": "vllm-ngram",
               "draft": "vllm-draft", "plain": "vllm-eagle1"}
_VLLM_POOLS = (("plain", "plain", 0), ("eagle3-k2", "eagle3", 2), ("eagle3-k5", "eagle3", 5),
               ("eagle-k3", "eagle", 3), ("ngram-k4", "ngram", 4), ("draft-k3", "draft", 3))
VLLM_MAX_K = {"plain": 0, "eagle3": 8, "eagle": 5, "ngram": 8, "draft": 4}
VLLM_FLEET = tuple(SimPool(name, "vllm", method, k, False, 2, VLLM_MAX_K[method],
                            VLLM_CURVES[method], group=name)
                   for name, method, k in _VLLM_POOLS)

VLLM = Scenario(
    "vllm", VLLM_FLEET, VLLM_CURVES,
    {"code": "eagle3-k5", "structured": "ngram-k4", "chat": "eagle3-k2"},
    notes="vLLM 0.33, six (method, k) pools of 2 workers, relaunch to change k (Table 5 + blog)")

SCENARIOS = {s.name: s for s in (SGLANG, VLLM, EMBEDDED)}
PRIMARY = "sglang"
