"""The routing core's shape, checked: a chat request's walk through the packages stays
short, the decision is one call into one policy Protocol, and `k` is set after the
policy's choice in one function only.

The walk (`bench.gateway.walk`) is measured on the real app in this process, in front of
the benchmark's upstream (a real HTTP server in its own process), with the learned policy.
"""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

from bench.gateway.walk import measure
from gateway.compiled import extension_path
from gateway.routing.slo_aware import SloAware
from policies.decision import Policy

ROOT = Path(__file__).resolve().parents[3]
# 31 crossings before the routing core (main of 2026-12-05, same measure); issue 40's
# target is 12: docs/results/2026-12-06-routing-core.md says what is left. 18 since the
# per-request prediction: the classifier's one step into policies/predictor.py
MAX_CROSSINGS = 18


def test_a_chat_request_crosses_few_packages_and_decides_once(bench_upstream: str,
                                                              monkeypatch) -> None:  # noqa: ANN001
    calls: list[str] = []
    for cls, name in ((SloAware, "slo_aware"), (Policy, "learned")):
        original = cls.decide

        def counted(self, profile, pools, _original=original, _name=name):  # noqa: ANN001, ANN202
            calls.append(_name)
            return _original(self, profile, pools)

        monkeypatch.setattr(cls, "decide", counted)
    path = asyncio.run(measure(bench_upstream))
    areas = [stay.area for stay in path]
    # a compiled module runs no Python frame the walk can see: the admission pipeline's
    # stay shows only where it runs as Python
    assert areas[0] == "gateway/http"
    assert ("gateway/core" in areas) == (extension_path("gateway.core.admit") is None)
    assert len(path) - 1 <= MAX_CROSSINGS, [f"{s.area} {s.first_call}" for s in path]
    # the decision: the router asks its one policy (SLO-aware around the learned one)
    # once per request; warm-up requests decided too, four in all
    assert calls == ["slo_aware", "learned"] * 4
    assert areas.count("gateway/routing") <= 3 and areas.count("policies") <= 3  # predict, decide, record


def _k_writes(tree: ast.AST) -> list[int]:
    """Lines that rewrite a decision's `k`: `replace(decision, ..., k=...)` (a pool's view
    offered to the policy, `replace(view, k=...)`, is an input, not a rewrite)."""
    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "replace"
            and any(kw.arg == "k" for kw in node.keywords)
            and not (node.args and getattr(node.args[0], "id", "") == "view")]


def test_k_is_set_after_the_policy_in_one_function() -> None:
    """Only `gateway.pools.served` rewrites a decision's k; the SLO-aware policy's own
    choice among options is part of deciding, not a rewrite."""
    found = {}
    for path in sorted((ROOT / "gateway").rglob("*.py")):
        if lines := _k_writes(ast.parse(path.read_text())):
            found[str(path.relative_to(ROOT))] = lines
    assert set(found) == {"gateway/pools.py", "gateway/routing/slo_aware.py"}, found
    tree = ast.parse((ROOT / "gateway/pools.py").read_text())
    served = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "served")
    assert sorted(_k_writes(served)) == sorted(found["gateway/pools.py"])
