"""`specroute bench live`: the report's arithmetic on known records, and a tiny run through a
real stack (the bundled model, three pools, real gateways, Redis and workers) whose cold
adaptive gateway must have learned from nothing but its own requests."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.live import Settings, blocks, measure, running_stack, workload
from bench.live_report import COLD, WARM, Record, render, summarize
from policies.fleet import BUNDLED_MODEL_DIR

POOLS = ["p-plain", "p-fast-code", "p-fast-chat"]


def _rec(config: str, cls: str, rate: float, pool: str = "", seen: int = 0,
         item: int = -1) -> Record:
    return Record(1, config, cls, tokens=int(rate * 10), seconds=10.0, pool=pool or config,
                  seen=seen, item=item)


def test_oracle_ratios_and_violations_from_known_rates() -> None:
    records = [_rec("p-plain", "code/t0", 100), _rec("p-plain", "chat/t0", 100),
               _rec("p-fast-code", "code/t0", 200), _rec("p-fast-code", "chat/t0", 80),
               _rec("p-fast-chat", "code/t0", 100), _rec("p-fast-chat", "chat/t0", 150),
               _rec(COLD, "code/t0", 100, "p-plain"), _rec(COLD, "chat/t0", 80, "p-fast-code"),
               _rec(WARM, "code/t0", 200, "p-fast-code", seen=60),
               _rec(WARM, "chat/t0", 80, "p-fast-code", seen=70)]
    s = summarize(records, POOLS, "p-plain")[1]
    assert s["oracle_picks"] == {"code/t0": "p-fast-code", "chat/t0": "p-fast-chat"}
    assert s["rates"]["oracle"] == pytest.approx(350 / 2)
    assert s["best_single"] == "p-fast-code" and s["rates"]["p-fast-code"] == pytest.approx(140)
    warm = s["ratios"][WARM]
    assert warm["vs_oracle"] == pytest.approx(140 / 175)
    assert warm["gain_captured"] == pytest.approx(0.0)
    # chat/t0 went to a pool measured at 0.8x plain after 70 requests of the class: one violation
    assert {k: v for k, v in s["violations"][WARM].items() if k != "as_served"} == {
        "checked": 2, "violations": 1, "most_seen": 71}
    assert s["violations"][COLD]["checked"] == 0
    assert s["decisions"][WARM]["chat/t0"]["picks"] == {"p-fast-code": 1}
    assert s["best_mix"]["ratio"] == pytest.approx(175 / 140)


def test_picks_checked_as_served_against_plain_on_the_same_prompts() -> None:
    # pinned p-fast-code is slow on chat at its configured k, but the warm gateway served
    # chat/t0 there faster than plain on the same prompts: a violation only as pinned
    records = [_rec("p-plain", "chat/t0", 100, item=0), _rec("p-plain", "chat/t0", 50, item=1),
               _rec("p-fast-code", "chat/t0", 60, item=0),
               _rec("p-fast-code", "chat/t0", 30, item=1),
               _rec(WARM, "chat/t0", 110, "p-fast-code", seen=60, item=0),
               _rec(WARM, "chat/t0", 40, "p-plain", seen=61, item=1),
               _rec(WARM, "code/t0", 10, "p-fast-code", seen=70, item=2),  # no plain pair
               _rec("warmup", "chat/t0", 10, "p-fast-code", seen=80)]  # warm-up: unpaired
    v = summarize(records, ["p-plain", "p-fast-code"], "p-plain")[1]["violations"][WARM]
    assert v["violations"] == 2  # the fast-code pick and the warm-up pick, as pinned
    # as served: chat/t0 on fast-code 110 vs plain's 100 on prompt 0 (fine); on plain 40 vs
    # plain's own pinned 50 on prompt 1: 0.8x, below 0.9x
    assert v["as_served"] == {"checked": 2, "violations": 1, "slow": ["chat/t0 on p-plain (0.80x)"]}


def test_a_stated_mix_draws_only_its_classes() -> None:
    settings = Settings(per_cell=3, warmup=0, max_tokens=8, concurrency=(1,),
                        classes=("edit/t0", "chat/t0.8"))
    items = workload("m", settings, seed=1)
    assert sorted(cls for cls, _ in items) == ["chat/t0.8"] * 3 + ["edit/t0"] * 3
    assert {body["temperature"] for cls, body in items if cls == "edit/t0"} == {0.0}
    assert "edit/t0, chat/t0.8" in settings.describe("m", ["p"])
    with pytest.raises(ValueError, match="unknown classes"):
        _ = Settings(per_cell=1, warmup=0, max_tokens=8, concurrency=(1,),
                     classes=("edit/t0.5",)).cells


def test_every_item_goes_to_every_configuration_in_rotating_blocks() -> None:
    settings = Settings(per_cell=2, warmup=0, max_tokens=8, concurrency=(1,))
    items = workload("m", settings, seed=0)
    assert len(items) == 16 and {cls for cls, _ in items} == {
        f"{t}/t{x}" for t in ("code", "structured", "chat", "edit") for x in ("0", "0.8")}
    rounds = blocks(items, ["a", "b", "c"], 6)
    # 16 items in blocks of 6: three rounds (6, 6, 4 items), each to every configuration
    assert [(b[0].config, len(b)) for b in rounds] == [
        ("a", 6), ("b", 6), ("c", 6), ("b", 6), ("c", 6), ("a", 6), ("c", 4), ("a", 4), ("b", 4)]
    for block in rounds:
        assert len({j.config for j in block}) == 1
    for config in "abc":
        assert [(j.item, j.body) for b in rounds for j in b if j.config == config] == [
            (i, body) for i, (_, body) in enumerate(items)]
    warm = workload("m", settings, seed=1000, count=30,
                    exclude=frozenset(b["messages"][-1]["content"] for _, b in items))
    assert len(warm) == 30
    assert not {b["messages"][-1]["content"] for _, b in warm} & {
        b["messages"][-1]["content"] for _, b in items}


@pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").exists(), reason="no bundled model")
def test_tiny_run_through_a_real_stack(tmp_path: Path) -> None:
    settings = Settings(per_cell=1, warmup=2, max_tokens=6, concurrency=(1, 2))
    with running_stack(tmp_path, str(BUNDLED_MODEL_DIR), "plain,ngram") as stack:
        records, audits = measure(stack, settings, progress=False)
        pools = stack.pools
        summary = summarize(records, pools, stack.plain)
    assert pools == ["embedded-plain", "embedded-ngram"]
    assert not [r for r in records if r.error]
    for conc in (1, 2):
        # the cold gateway learned from exactly its own 8 requests: no pinned one reached it
        assert audits[conc] == {"own_requests": 8, "telemetry_records": 8, "same_pools": True}
        s = summary[conc]
        assert s["requests"] == {c: 8 for c in (COLD, WARM, *pools)}
        assert set(s["rates"]) == {COLD, WARM, *pools, "oracle"}
        assert s["rates"]["oracle"] >= max(s["rates"][p] for p in pools)
        assert set(s["ratios"]) == {COLD, WARM}
    assert [r.seen for r in records if r.config == COLD and r.cls == "code/t0"] == [0, 0]
    table = render(summary, "test")
    for heading in ("### concurrency 1", "### concurrency 2", "| configuration | requests |",
                    "| adaptive | / oracle | / best single | oracle gain captured |",
                    "| class | adaptive-cold | adaptive-warm | plain | ngram |"):
        assert heading in table
