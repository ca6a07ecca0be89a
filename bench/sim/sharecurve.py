"""The headline over the traffic it assumes: the shipped strategy against the best
homogeneous fleet and against the two-line static rule (bench/sim/baselines.py
`EditRule`) at each copy-heavy (edit) share of `CURVE_SHARES`, with and without the
fine-tune phase.

The edit share is an assumption of the workload (bench/sim/simulator.py
`default_phases`), and most of the routed fleet's gain over EAGLE-3 alone is on edits, so
a headline read at one share says little; each point here is a run of its own arrivals
at that share (plain, every fixed (method, k), the operator's table, the shipped
strategy and the static rule: `run_routers(lean=True)`). "Without the fine-tune phase"
drops the requests of the phases whose `drafter_scale` weakens trained drafters (not
n-gram) from the same run, the best homogeneous fleet chosen again over what is left:
phases run in order, so the earlier phases' requests are the ones a run without it
serves, but for the few still in flight at the boundary.
"""

from __future__ import annotations

from collections.abc import Callable

from bench.sim.evaluation import FIXED_KS, best_fixed_name, mean_tokens_per_s, run_routers
from bench.sim.scenarios import SCENARIOS, Scenario
from bench.sim.simulator import Outcome, SimConfig
from policies.decision import PolicyConfig

CURVE_SHARES = (0.0, 0.05, 0.1, 0.2)


def share_point(outcomes: dict[str, list[Outcome]], config: SimConfig, share: float) -> dict:
    """One point of the curve from a run's outcomes: overall and without the fine-tune
    phase (None where every phase is one)."""
    steady = {i for i, p in enumerate(config.phases) if p.drafter_scale == 1.0}

    def ratios(phases: set[int] | None) -> dict:
        best = best_fixed_name(outcomes, phases)
        tps = {name: mean_tokens_per_s(outcomes[name], phases)
               for name in ("adaptive", "static-rule", "rules", best)}
        return {"vs_best_homogeneous": tps["adaptive"] / tps[best],
                "vs_static_rule": tps["adaptive"] / tps["static-rule"],
                "static_rule_vs_best_homogeneous": tps["static-rule"] / tps[best],
                "vs_static_split": tps["adaptive"] / tps["rules"],
                "best_homogeneous": best}

    without = ratios(steady) if steady and len(steady) < len(config.phases) else None
    return {"edit_share": share, **ratios(None), "without_fine_tune": without}


def copy_share_curve(config_at: Callable[[float], SimConfig],
                     policy_config: PolicyConfig | None = None,
                     fixed_ks: tuple[int, ...] = FIXED_KS,
                     scenario: Scenario = SCENARIOS["sglang-pools"],
                     done: tuple[float, dict[str, list[Outcome]]] | None = None,
                     shares: tuple[float, ...] = CURVE_SHARES) -> list[dict]:
    """A point per share (`config_at(share)`: the run's config at that share); `done`:
    (share, outcomes) of a full run already made at one of them, reused."""
    out = []
    for share in shares:
        config = config_at(share)
        if done is not None and abs(done[0] - share) < 1e-12:
            outcomes = done[1]
        else:
            outcomes = run_routers(config, policy_config, fixed_ks, scenario, lean=True).outcomes
        out.append(share_point(outcomes, config, share))
    return out


def curve_table(curve: list[dict]) -> str:
    head = (f"{'edit share':>10}{'vs best homog.':>16}{'vs static rule':>16}"
            f"{'rule vs best':>14}{'  (no fine-tune phase: same three)':<36}  best homogeneous")
    lines = [head, "-" * len(head)]
    for p in curve:
        w = p["without_fine_tune"]
        rest = (f"{w['vs_best_homogeneous']:>8.3f}{w['vs_static_rule']:>8.3f}"
                f"{w['static_rule_vs_best_homogeneous']:>8.3f}" if w else f"{'-':>24}")
        lines.append(f"{p['edit_share']:>10.2f}{p['vs_best_homogeneous']:>16.3f}"
                     f"{p['vs_static_rule']:>16.3f}{p['static_rule_vs_best_homogeneous']:>14.3f}"
                     f"{rest:<36}  {p['best_homogeneous']}")
    return "\n".join(lines)
