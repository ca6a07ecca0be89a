"""`specroute bench live`: its arithmetic on known numbers (mix rates, the held-out oracle,
the best homogeneous fleet, bootstrap intervals), the fleets it compares, the randomised
order of configurations, and the report and JSON built from records. No engine runs here:
the smoke run through real stacks is `specroute bench live --model tiny --quick`."""

from __future__ import annotations

import random
from dataclasses import replace

import numpy as np
import pytest

from bench.live.fleets import (
    ADAPTIVE,
    Config,
    Record,
    fleets,
    k_grid,
    missing_ks,
    read_reason,
    schedule,
)
from bench.live.prompts import MIXES, Item
from bench.live.report import (
    adaptive_picks,
    prompt_rows,
    render,
    summarize,
    targets,
    uncovered,
)
from bench.live.stats import RESAMPLED, bootstrap, estimate, from_rows
from policies.options import candidate_ks
from policies.request_limits import MAX_K
from policies.types import PoolView


def _rows(table: dict[str, list[tuple[str, int, dict[str, float]]]]) -> list[dict]:
    """{class: [(_, fold, {config: tokens/s over a 1 s request})]} -> prompt rows."""
    return [{"cls": cls, "fold": fold, "replicate": 0,
             "cells": {c: (rate, 1.0) for c, rate in rates.items()}}
            for cls, prompts in table.items() for _, fold, rates in prompts]


def test_mix_rate_weighs_per_request_means_by_the_shares() -> None:
    # class a: 10 tokens in 1 s per request; class b: 30 tokens in 3 s and 10 in 1 s
    rows = [{"cls": "a", "fold": 0, "cells": {ADAPTIVE: (10, 1.0), "p": (10, 1.0)}},
            {"cls": "a", "fold": 1, "cells": {ADAPTIVE: (10, 1.0), "p": (10, 1.0)}},
            {"cls": "b", "fold": 0, "cells": {ADAPTIVE: (30, 3.0), "p": (30, 1.0)}},
            {"cls": "b", "fold": 1, "cells": {ADAPTIVE: (10, 1.0), "p": (10, 1.0)}}]
    data = from_rows(rows, ADAPTIVE)
    e = estimate(data, {"a": 0.75, "b": 0.25})
    # adaptive: (0.75 * 10 + 0.25 * 20) / (0.75 * 1 + 0.25 * 2) = 12.5 / 1.25
    assert e.adaptive == pytest.approx(10.0)
    # p: (0.75 * 10 + 0.25 * 20) / (0.75 + 0.25 * 1) = 12.5
    assert e.rates["p"] == pytest.approx(12.5) and e.best_name == "p"
    assert e.vs_best == pytest.approx(0.8)


def test_the_oracle_is_chosen_on_one_fold_and_scored_on_the_other() -> None:
    # On class x, config A is fast on fold 0 and slow on fold 1, B the other way round: the
    # in-sample per-class maximum would be 100 tok/s, the held-out oracle serves each fold
    # with the other fold's winner and gets the slow halves.
    rows = _rows({
        "x": [("", 0, {ADAPTIVE: 60, "A": 100, "B": 20}), ("", 1, {ADAPTIVE: 60, "A": 20, "B": 100})],
        "y": [("", 0, {ADAPTIVE: 50, "A": 10, "B": 40}), ("", 1, {ADAPTIVE: 50, "A": 10, "B": 60})],
    })
    data = from_rows(rows, ADAPTIVE)
    e = estimate(data, {"x": 0.5, "y": 0.5})
    assert e.oracle_picks == {"x": ("B", "A"), "y": ("B", "B")}
    # oracle: x served at 20 and 20, y at 40 and 60 -> (20+20+40+60) tokens / 4 s
    assert e.oracle == pytest.approx(35.0)
    # homogeneous: A (100+20+10+10)/4 = 35, B (20+100+40+60)/4 = 55 -> best is B; adaptive 55
    assert e.best_name == "B" and e.best == pytest.approx(55.0)
    assert e.adaptive == pytest.approx(55.0) and e.vs_oracle == pytest.approx(55 / 35)
    # the adaptive configuration is never a candidate, however fast
    fast = _rows({"x": [("", 0, {ADAPTIVE: 999, "A": 1}), ("", 1, {ADAPTIVE: 999, "A": 1})]})
    got = estimate(from_rows(fast, ADAPTIVE), {"x": 1.0})
    assert got.best_name == "A" and got.oracle_picks == {"x": ("A", "A")}


def test_a_class_without_two_folds_is_refused() -> None:
    rows = _rows({"x": [("", 0, {ADAPTIVE: 1, "A": 1})]})
    with pytest.raises(ValueError, match="at least 2 prompts per class"):
        estimate(from_rows(rows, ADAPTIVE), {"x": 1.0})


def test_bootstrap_intervals_cover_the_estimate_and_shrink_with_agreement() -> None:
    rng = random.Random(3)
    noisy = _rows({"x": [("", i % 2, {ADAPTIVE: 100 * rng.uniform(0.7, 1.3),
                                       "A": 90 * rng.uniform(0.7, 1.3),
                                       "B": 80 * rng.uniform(0.7, 1.3)}) for i in range(40)]})
    data = from_rows(noisy, ADAPTIVE)
    ci = bootstrap(data, {"x": 1.0}, seed=1, draws=400)
    for key in ("vs_best_homogeneous", "vs_oracle"):
        mean, low, high = ci[key]
        assert low < mean < high and high - low > 0.02
    assert bootstrap(data, {"x": 1.0}, seed=1, draws=400) == ci  # seeded
    # every prompt says the same ratio: the interval collapses onto it
    same = _rows({"x": [("", i % 2, {ADAPTIVE: 120, "A": 100}) for i in range(10)]})
    mean, low, high = bootstrap(from_rows(same, ADAPTIVE), {"x": 1.0}, draws=200)[
        "vs_best_homogeneous"]
    assert mean == pytest.approx(1.2) and low == pytest.approx(1.2) and high == pytest.approx(1.2)


def test_the_ceiling_is_the_held_out_oracle_over_the_best_homogeneous_fleet() -> None:
    # A is best on x, B on y (each on both folds): per-class routing wins over either
    # fleet alone by what the other class gains; the verdict says when a target is beyond it
    rows = _rows({"x": [("", f, {ADAPTIVE: 30, "A": 30, "B": 10}) for f in (0, 1, 0, 1)],
                  "y": [("", f, {ADAPTIVE: 30, "A": 10, "B": 30}) for f in (0, 1, 0, 1)]})
    data = from_rows(rows, ADAPTIVE)
    e = estimate(data, {"x": 0.5, "y": 0.5})
    assert e.ceiling == pytest.approx(60 / 40) and e.vs_oracle == pytest.approx(1.0)
    mean, low, high = bootstrap(data, {"x": 0.5, "y": 0.5}, draws=200)[
        "oracle_vs_best_homogeneous"]
    assert low == pytest.approx(mean) == pytest.approx(high) == pytest.approx(1.5)
    flat = {"vs_best_homogeneous": (1.0, 0.95, 1.05), "vs_oracle": (1.0, 0.95, 1.05)}
    assert "out of reach" in targets("vllm", "even", {
        **flat, "oracle_vs_best_homogeneous": (1.01, 0.99, 1.04)})
    assert "out of reach" not in targets("vllm", "even", {
        **flat, "oracle_vs_best_homogeneous": (1.2, 1.05, 1.3)})


def test_bootstrap_resamples_within_class_and_fold() -> None:
    # a resample that mixed classes or folds would leave a fold empty and raise; and
    # every draw keeps the class shares exactly, so a ratio that only class sizes could
    # move stays put
    rows = _rows({"x": [("", f, {ADAPTIVE: 10, "A": 10}) for f in (0, 1)],
                  "y": [("", f, {ADAPTIVE: 40, "A": 20}) for f in (0, 1, 0, 1)]})
    mean, low, high = bootstrap(from_rows(rows, ADAPTIVE), {"x": 0.5, "y": 0.5},
                                draws=300)["vs_best_homogeneous"]
    assert low == pytest.approx(mean) and high == pytest.approx(mean)
    assert mean == pytest.approx((10 + 40) / (10 + 20) * 1.0 / 1.0)


def test_equal_fleets_and_every_k_the_policy_may_choose() -> None:
    embedded = fleets("embedded", ["plain", "ngram", "eagle"], ["plain", "ngram", "eagle"])
    assert [f.name for f in embedded] == [ADAPTIVE, "3xplain", "3xngram", "3xeagle"]
    assert {len(f.methods) for f in embedded} == {3}  # as many servers in every fleet
    assert embedded[0].configs == (Config(ADAPTIVE),)
    ngram = embedded[2].configs
    # every k the adaptive gateway may pick on its per-request-k pool: the policy's
    # candidates there (1 .. PoolView.max_k; its trust region creeps up within a run)
    view = PoolView("embedded-ngram", "embedded", "ngram", 6, True, 1, 0)
    assert [c.k for c in ngram] == [k for k in candidate_ks(view) if k] == k_grid("ngram", None)
    assert [c.k for c in ngram] == list(range(1, MAX_K + 1))
    assert all(c.pool == "embedded-ngram" for c in ngram)
    assert embedded[1].configs == (Config("plain", "embedded-plain"),)
    subset = ("1", "3", "40", "ngram:6", "eagle:2")
    assert [c.k for c in fleets("embedded", ["plain", "ngram"], ["ngram"], subset)[1].configs] \
        == [1, 3, 6] and k_grid("eagle", subset) == [1, 2, 3]
    vllm = fleets("vllm", ["plain", "ngram"], ["plain", "ngram", "eagle"])
    assert [(f.name, f.methods) for f in vllm] == [
        (ADAPTIVE, ("plain", "ngram")), ("2xplain", ("plain", "plain")),
        ("2xngram", ("ngram", "ngram")), ("2xeagle", ("eagle", "eagle"))]
    assert [c.name for f in vllm[1:] for c in f.configs] == ["plain", "ngram k=4", "eagle k=3"]
    assert all(c.k is None for f in vllm for c in f.configs)  # vLLM: k as launched


def test_pinned_configurations_are_marked_benchmark_and_adaptive_carries_nothing() -> None:
    assert Config(ADAPTIVE).headers == {}
    assert Config("ngram k=3", "embedded-ngram", 3).headers == {
        "x-specroute-pool": "embedded-ngram", "x-specroute-benchmark": "1", "x-specroute-k": "3"}
    assert Config("plain", "vllm-plain").headers == {
        "x-specroute-pool": "vllm-plain", "x-specroute-benchmark": "1"}


def _items(n: int) -> list[Item]:
    return [Item("code/t0", {"messages": [{"role": "user", "content": str(i)}]}, i % 2, i)
            for i in range(n)]


def test_every_configuration_serves_every_prompt_in_blocks_in_a_random_order() -> None:
    configs = tuple(Config(f"c{i}", "p", i) for i in range(4))
    items = _items(40)
    jobs = schedule(items, configs, 4, random.Random(7))
    assert len(jobs) == 10 * 4 and all(len(block) == 4 for _, block in jobs)
    for config in configs:  # each configuration: every item once, in the workload's order
        assert [it.index for c, block in jobs if c == config for it in block] == list(range(40))
    orders = [tuple(c.name for c, _ in jobs[i:i + 4]) for i in range(0, 40, 4)]
    assert all(len(set(order)) == 4 for order in orders)  # a block goes to each once
    assert len(set(orders)) > 3  # drawn afresh per block, not rotated or fixed
    firsts = {order[0] for order in orders}
    assert len(firsts) >= 3
    assert schedule(items, configs, 4, random.Random(7)) == jobs  # seeded
    assert schedule(items, configs, 4, random.Random(8)) != jobs


def _record(config: str, cls: str, item: int, fold: int, rate: float, conc: int = 1,
            replicate: int = 0, error: str = "") -> Record:
    return Record(replicate, conc, "f", config, cls, fold, item, int(rate), 1.0,
                  "embedded-ngram" if config == ADAPTIVE else "", 2, error)


def test_a_failed_prompt_counts_against_the_configuration_that_failed_it() -> None:
    # A fails prompt 2 after 0.2 s; the others served it in 1 s: A is charged 0 tokens over
    # 1 s there (a served request's time), the prompt stays for every configuration
    records = [_record(c, "code/t0", i, i % 2, 10) for c in (ADAPTIVE, "A", "B") for i in range(4)]
    records[6] = replace(_record("A", "code/t0", 2, 0, 0, error="boom"), seconds=0.2)
    got = prompt_rows(records)
    assert len(got.rows) == 4 and got.failures == {"A": 1} and got.unserved == 0
    failed = next(r for r in got.rows if r["failed"])
    assert failed["cells"]["A"] == (0, 1.0) and failed["cells"]["B"] == (10, 1.0)
    e = estimate(from_rows(got.rows, ADAPTIVE), {"code/t0": 1.0})
    assert e.rates["A"] == pytest.approx(30 / 4) and e.rates["B"] == pytest.approx(10.0)
    assert e.best_name == "B"  # A's failure made it slower, not excused
    # a slow failure keeps its own (longer) time
    records[6] = replace(records[6], seconds=3.0)
    assert next(r for r in prompt_rows(records).rows if r["failed"])["cells"]["A"] == (0, 3.0)
    # a prompt every configuration failed, or one some configuration never got, is left out
    everywhere = [replace(r, error="down") if r.item == 1 else r for r in records]
    assert prompt_rows(everywhere).failed_everywhere == 1
    assert prompt_rows([r for r in records if (r.item, r.config) != (3, "B")]).unserved == 1
    # the summary names each configuration's failures per mix, in the table and the JSON
    summary = summarize(_even_records(failing={"A": 3}), [], "embedded")
    assert summary["concurrency"][1]["failures"] == {"A": 3}
    cell = summary["json"]["embedded"]["even"]["1"]
    assert cell["failures"] == {ADAPTIVE: 0, "A": 3, "B": 0}
    assert "failures per configuration (each charged as zero tokens over a served " \
        "request's time): A 3" in render(summary, "test")


def _even_records(failing: dict[str, int] | None = None, replicates: int = 2) -> list[Record]:
    """Every class of the even mix, 4 prompts each per replicate: adaptive ~120 tok/s, A
    ~100, B ~90; `failing`: how many of its first prompts each configuration failed."""
    rng = np.random.default_rng(0)
    records = []
    for rep in range(replicates):
        for n, cls in enumerate(MIXES["even"]):
            for i in range(4):
                item = 10 * n + i
                for config, base in ((ADAPTIVE, 120), ("A", 100), ("B", 90)):
                    fail = rep == 0 and item < (failing or {}).get(config, 0)
                    records.append(_record(config, cls, item, i % 2,
                                           0 if fail else base * rng.uniform(0.9, 1.1),
                                           replicate=rep, error="boom" if fail else ""))
    return records


def _replicated(ratios: list[float], per_class: int = 8) -> list[dict]:
    """Prompt rows over replicates whose adaptive / A ratio is `ratios[r]`, with +-2% noise
    per prompt: the replicates differ systematically, the prompts within one hardly."""
    rng = random.Random(5)
    return [{"cls": cls, "fold": i % 2, "replicate": rep,
             "cells": {ADAPTIVE: (100 * ratio * rng.uniform(0.98, 1.02), 1.0),
                       "A": (100 * rng.uniform(0.98, 1.02), 1.0)}}
            for rep, ratio in enumerate(ratios) for cls in ("x", "y") for i in range(per_class)]


def test_intervals_are_clustered_by_replicate() -> None:
    ratios = [0.8, 1.0, 1.25]  # per-replicate results spanned 0.79-1.26 at c = 4 (issue 42)
    data = from_rows(_replicated(ratios), ADAPTIVE)
    shares = {"x": 0.5, "y": 0.5}
    mean, low, high = bootstrap(data, shares, seed=2, draws=1000)["vs_best_homogeneous"]
    _, p_low, p_high = bootstrap(data, shares, seed=2, draws=1000,
                                 by_replicate=False)["vs_best_homogeneous"]
    # resampling prompts alone takes the replicates' difference as fixed: narrow, well
    # inside the replicates' spread
    assert p_low < mean < p_high and p_low > min(ratios) + 0.1 and p_high < max(ratios) - 0.1
    # resampling whole replicates first shows it: the interval spans the replicates
    assert high - low > 3 * (p_high - p_low)
    assert low <= min(ratios) + 0.03 and high >= max(ratios) - 0.03
    # replicates that agree: the clustered interval is as narrow as the prompt-only one
    same = from_rows(_replicated([1.0, 1.0, 1.0]), ADAPTIVE)
    _, s_low, s_high = bootstrap(same, shares, seed=2, draws=500)["vs_best_homogeneous"]
    assert s_high - s_low < 0.03
    # the summary resamples replicates and says so; with one replicate it cannot
    cell = summarize(_even_records(), [], "embedded")["json"]["embedded"]["even"]["1"]
    assert cell["interval"] == {"bootstrap": RESAMPLED[True], "replicates": 2}
    assert set(cell["by_replicate"]) == {"0", "1"}
    one = summarize(_even_records(replicates=1), [], "embedded")["json"]["embedded"]["even"]
    assert one["1"]["interval"] == {"bootstrap": RESAMPLED[False], "replicates": 1}


def test_pinned_ks_must_cover_the_adaptive_gateways_picks() -> None:
    assert missing_ks(["plain", "ngram", "eagle"], ["plain", "ngram", "eagle"], None) == {}
    gaps = missing_ks(["plain", "ngram", "eagle"], ["plain", "ngram"], ("1", "2", "ngram:6"))
    assert gaps == {"ngram": [k for k in range(3, MAX_K + 1) if k != 6]}  # eagle: no fleet
    # what the adaptive gateway picked that no pinned configuration measured
    picks = [replace(_record(ADAPTIVE, "code/t0", i, 0, 10), pool=pool, k=k)
             for i, (pool, k) in enumerate([("embedded-ngram", 6), ("embedded-ngram", 9),
                                            ("embedded-ngram", 9), ("embedded-plain", 0),
                                            ("embedded-eagle", 3)])]
    assert uncovered({"plain", "ngram k=6", "eagle k=3"}, picks) == {"ngram k=9": 2}
    summary = summarize([*picks, *(replace(p, config="ngram k=6") for p in picks)], [],
                        "embedded")
    assert summary["concurrency"][1]["uncovered"] == {"eagle k=3": 1, "ngram k=9": 2,
                                                      "plain": 1}
    assert "adaptive picks no pinned configuration measured" in render(summary, "test")


def test_summary_json_per_engine_mix_and_concurrency() -> None:
    records = _even_records()
    audits = [{"fleet": ADAPTIVE, "replicate": 0, "adaptive_requests": 40, "learned_from": 40,
               "pinned": 0, "clean": True}]
    summary = summarize(records, audits, "embedded")
    out = summary["json"]["embedded"]
    assert set(out) == set(MIXES)
    cell = out["code assistant"]["1"]
    assert set(cell) == {"vs_best_homogeneous", "vs_oracle", "oracle_vs_best_homogeneous",
                         "interval", "by_replicate", "failures", "best_homogeneous",
                         "requests_per_cell", "shares"}
    mean, low, high = cell["vs_best_homogeneous"]
    assert low <= mean <= high and 1.1 < mean < 1.3 and cell["best_homogeneous"] == "A"
    assert cell["requests_per_cell"] == 8  # 4 prompts per class in each of 2 replicates
    table = render(summary, "test")
    for text in ("### concurrency 1", "| mix (shares) |", "code assistant (code/t0 40%",
                 "| class | adaptive | A | B |", "learned from 40 records, 0 pinned",
                 "clean", "ngram k=2 x"):
        assert text in table


def test_a_homogeneous_embedded_fleet_is_one_pool_of_n_workers(tmp_path) -> None:
    # `specroute up --methods ngram,ngram,ngram` (what the bench starts for 3 x ngram)
    from specroute.stack import build_config

    (tmp_path / "config.json").write_text('{"max_position_embeddings": 2048}')
    config = build_config([("ngram", 1), ("ngram", 2), ("ngram", 3)], "127.0.0.1", 8000,
                          "redis://x", tmp_path)
    assert [p["name"] for p in config["pools"]] == ["embedded-ngram"]
    assert config["pools"][0]["workers"] == [f"http://127.0.0.1:{i}" for i in (1, 2, 3)]
    mixed = build_config([("plain", 1), ("ngram", 2)], "127.0.0.1", 8000, "redis://x", tmp_path)
    assert [len(p["workers"]) for p in mixed["pools"]] == [1, 1]


def test_the_gateways_reading_of_a_request_is_kept_and_shown() -> None:
    """`x-specroute-reason` names the task the gateway classified and marks exploration
    tries: the picks show an edit taken for code, and a try, apart from the rest."""
    assert read_reason("code/t0: embedded-eagle eagle k=1 predicted 1.6 tok/step, 1.1x "
                       "plain (exploring)") == ("code", True)
    assert read_reason("edit/t0: embedded-ngram ngram k=6 predicted 3.1 tok/step, 1.4x "
                       "plain; slo acme: meets") == ("edit", False)
    assert read_reason("pinned by x-specroute-pool") == ("", False)
    assert read_reason("") == ("", False)
    edits = [replace(_record(ADAPTIVE, "edit/t0", i, i % 2, 10), routed=routed,
                     explored=explored)
             for i, (routed, explored) in enumerate([("edit", False), ("edit", False),
                                                     ("code", False), ("edit", True)])]
    assert adaptive_picks(edits) == {"edit/t0": {"ngram k=2": 2, "ngram k=2 as code": 1,
                                             "ngram k=2 exploring": 1}}
