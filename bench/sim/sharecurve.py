"""The headline over the traffic it assumes: the shipped strategy against the best
homogeneous fleet and against the two-line static rule (bench/sim/baselines.py
`EditRule`) at each copy-heavy (edit) share of `CURVE_SHARES`, with and without the
fine-tune phase.

The edit share is an assumption of the workload (bench/sim/simulator.py
`default_phases`), and most of the routed fleet's gain over EAGLE-3 alone is on edits, so
a headline read at one share says little; each point here is a run of its own arrivals
at that share (plain, every fixed (method, k), the operator's table, the shipped
strategy, the same launched from the observed class mix where the fleet launches, and
the static rule: `run_routers(lean=True)`). "Without the fine-tune phase"
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
        observed = ("adaptive-observed-mix" in outcomes
                    and mean_tokens_per_s(outcomes["adaptive-observed-mix"], phases) / tps[best])
        return {"vs_best_homogeneous": tps["adaptive"] / tps[best],
                "vs_static_rule": tps["adaptive"] / tps["static-rule"],
                "static_rule_vs_best_homogeneous": tps["static-rule"] / tps[best],
                "vs_static_split": tps["adaptive"] / tps["rules"],
                "observed_mix_vs_best_homogeneous": observed or None,
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
    names = ("vs_best_homogeneous", "vs_static_rule", "static_rule_vs_best_homogeneous",
             "observed_mix_vs_best_homogeneous")

    def cells(part: dict | None) -> str:
        if part is None:
            return "".join(f"{'-':>8}" for _ in names)
        return "".join(f"{part[n]:>8.3f}" if part[n] is not None else f"{'-':>8}"
                       for n in names)

    group = f"{'vs best':>8}{'vs rule':>8}{'rule':>8}{'obs.mix':>8}"
    head = (f"{'edit':>6}{'all phases':>32}  {'without the fine-tune phase':>32}\n"
            f"{'share':>6}{group}  {group}  best homogeneous")
    lines = [head, "-" * 82]
    for p in curve:
        lines.append(f"{p['edit_share']:>6.2f}{cells(p)}  {cells(p['without_fine_tune'])}"
                     f"  {p['best_homogeneous']}")
    lines.append("(vs best / vs rule: adaptive over the best homogeneous fleet / the static "
                 "rule; rule: the static rule over the best homogeneous; obs.mix: adaptive "
                 "launched from the observed mix over the best homogeneous)")
    return "\n".join(lines)
