"""The trace world on the recorded SmolLM2 traces: the fixed-k walk, the step costs, and
fleets scored on a small slice — the oracles bound every fleet, a homogeneous fleet
scores 1.0 against itself, the adaptive fleet's decisions are the shipped policy's."""

from __future__ import annotations

import json

import pytest

from bench.traces.adaptive import adaptive, profile_of
from bench.traces.fleets import (
    COPY_HEAVY,
    PLAIN,
    Costs,
    PoolSpec,
    best_by_group,
    grid,
    mix_sequence,
    score_fleets,
)
from bench.traces.run import usable
from bench.traces.world import (
    DATA,
    H100,
    MEASURED,
    embedded_law,
    load_traces,
    serve,
    walk,
)
from policies.accept_curve import accept_length_at
from policies.prior import Measured
from specroute.cli import build_parser


@pytest.fixture(scope="module")
def traces():
    return load_traces(DATA / "smollm2")


# One prompt per category, written here: the recorded prompts' text is fetched data kept
# out of git, and the world only needs a request of the right kind per recorded id.
CATEGORY_PROMPTS = {
    "chat": "What are some good habits for getting better sleep?",
    "code_generation": "Complete this Python function.\n\n```python\ndef mean(values):\n"
                       "    \"\"\"The arithmetic mean of a list of numbers.\"\"\"\n```",
    "code_edit": "Rename the variable total to amount in this function.\n\ndef add_tax(total, "
                 "rate):\n    total = total * (1 + rate)\n    return round(total, 2)\n\n"
                 "print(add_tax(100, 0.2))\n",
    "json": "Return the three largest planets as a JSON array of objects with name and radius.",
    "summarization": "Summarize the following dialogue.\n\n#Person1#: The train is late again. "
                     "#Person2#: It was late all week; the line is being repaired until "
                     "Friday, so they run every twenty minutes. #Person1#: Then I will take "
                     "the bus tomorrow and leave ten minutes earlier.",
    "qa_extraction": "Read the passage and answer the question.\n\nThe bridge was opened in "
                     "1932 after six years of work. It carries two rail lines and eight "
                     "lanes of road, and its arch is 503 metres long.\n\nHow long is the "
                     "arch?",
    "translation": "Translate this English text into French.\n\nThe museum is closed on "
                   "Mondays and on public holidays.",
    "math": "A baker made 48 rolls and sold 3 bags of 9 rolls. How many rolls are left?",
    "input_task": "Suggest a title for this blog post.\n\nTen ways to grow tomatoes on a "
                  "small balcony.",
}


@pytest.fixture(scope="module")
def prompts(traces):
    """A prompt of the recorded category for every recorded id."""
    return {rid: {"id": rid, "source": rid.split(":")[0], "category": m["plain"].category,
                  "messages": [{"role": "user",
                                "content": CATEGORY_PROMPTS[m["plain"].category]}]}
            for rid, m in traces.items()}


@pytest.fixture(scope="module")
def prompts_file(prompts, tmp_path_factory):
    """The prompts above as a prompts JSONL, for the command."""
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(item) + "\n" for item in prompts.values()))
    return path


@pytest.fixture(scope="module")
def sliced(traces, prompts):
    """Three requests per category."""
    ids, per = [], {}
    for rid in usable(traces, prompts):
        category = traces[rid]["plain"].category
        if per.get(category, 0) < 3:
            per[category] = per.get(category, 0) + 1
            ids.append(rid)
    return ids


def test_the_walk_at_the_recorded_k_is_the_recording(traces) -> None:
    for methods in list(traces.values())[:40]:
        for method in ("ngram", "eagle"):
            trace = methods[method]
            assert walk(trace, trace.k).yields == trace.accept_lengths


def test_a_smaller_k_caps_each_step_and_keeps_the_output(traces) -> None:
    for methods in list(traces.values())[:40]:
        trace = methods["ngram"]
        for k in (1, 2, 4):
            w = walk(trace, k)
            assert w.tokens == sum(trace.accept_lengths) == trace.output_tokens - 1
            assert max(w.yields) <= k + 1 and max(w.drafts) <= k
            assert len(w.yields) >= len(trace.accept_lengths)
    plain = walk(next(iter(traces.values()))["plain"], 0)
    assert set(plain.yields) == {1} and set(plain.drafts) == {0}
    with pytest.raises(ValueError):
        walk(trace, trace.k + 1)


def test_h100_costs_are_the_published_fit() -> None:
    law = H100()
    plain = law.step("plain", 0, 1, 0, 0)
    assert plain == pytest.approx(2.101e-5 + 5.886e-3 + 1.207e-3, rel=1e-3)
    eagle = law.step("eagle", 4, 1, 0, 4)
    assert eagle == pytest.approx(5 * 2.101e-5 + 5.886e-3 + 5 * 8.414e-7 + 2.135e-3
                                  + 1.207e-3, rel=1e-3)
    unmatched = law.step("ngram", 8, 1, 0, 0)
    assert unmatched == pytest.approx(plain)  # nothing drafted: nothing verified or drafted
    # a batch of 32 like the request: 32 requests' KV and tokens in the forward
    assert law.step("plain", 0, 32, 1000, 0) == pytest.approx(
        32 * 1000 * 3.926e-8 + 32 * 2.101e-5 + 5.886e-3 + 1.207e-3, rel=1e-3)


def test_embedded_costs_are_the_measured_steps() -> None:
    law = embedded_law()
    with open(MEASURED) as handle:
        costs = Measured.from_dict(json.load(handle)).costs
    measured = {(c.method, c.k, c.batch): c.step_s for c in costs}
    for batch in (1, 2, 4):
        assert law.step("plain", 0, batch, 0, 0) == pytest.approx(
            measured[("plain", 0, batch)], rel=1e-6)
        # the policy's line in k through the measured k's: within 25% of each point
        for k in (1, 2, 4):
            assert law.step("eagle", k, batch, 0, k) == pytest.approx(
                measured[("eagle", k, batch)], rel=0.25)
    assert law.step("plain", 0, 32, 0, 0) > law.step("plain", 0, 8, 0, 0) > \
        law.step("plain", 0, 4, 0, 0)


def test_a_homogeneous_fleet_scores_one_against_itself(traces, sliced) -> None:
    costs = Costs(traces, "h100", 8)
    pool = PoolSpec("ngram", 4)
    alone = costs.score([(r, pool) for r in sliced])
    assert best_by_group(costs, sliced, ["all"] * len(sliced), [pool]) == [pool] * len(sliced)
    served = [serve(traces[r]["ngram"], "ngram", 4, 8, costs.law) for r in sliced]
    assert alone == pytest.approx(8 * sum(s.tokens for s in served)
                                  / sum(s.decode_s for s in served))


@pytest.mark.parametrize("world,batch", [("h100", 1), ("h100", 32), ("embedded", 8)])
def test_the_oracles_bound_every_fleet(traces, prompts, sliced, world, batch) -> None:
    costs = Costs(traces, world, batch)
    model = traces[sliced[0]]["plain"].model
    profiles = [profile_of(prompts[r], traces[r]["plain"].output_tokens, model)[0]
                for r in sliced]
    scores = score_fleets(costs, sliced, profiles, grid(8), "sglang")
    _, top = scores.best_homogeneous
    launched = {p.name for p in scores.launched}
    assert PLAIN.name in launched and scores.best_homogeneous[0] in launched
    run = adaptive(costs, sliced, prompts, scores.launched, world, 0, model)
    for figure in (top, scores.static, scores.oracle_class, run.score):
        assert scores.oracle_request >= figure * (1 - 1e-9)
    assert scores.oracle_class >= top * (1 - 1e-9)
    # per-request choice over pairs: no single assignment of a random request beats it
    alternative = [(r, scores.launched[i % len(scores.launched)]) for i, r in enumerate(sliced)]
    assert scores.oracle_request >= costs.score(alternative)


def test_adaptive_decisions_are_the_policys_and_it_learns(traces, prompts, sliced) -> None:
    costs = Costs(traces, "h100", 8)
    model = traces[sliced[0]]["plain"].model
    pools = [PLAIN, PoolSpec("ngram", 4), PoolSpec("eagle", 2)]
    sequence = sliced * 3
    first = adaptive(costs, sequence, prompts, pools, "h100", 5, model)
    again = adaptive(costs, sequence, prompts, pools, "h100", 5, model)
    assert [d.pool for d in first.decisions] == [d.pool for d in again.decisions]
    by_name = {p.name: p for p in pools}
    for rid, decision in zip(sequence, first.decisions, strict=True):
        profile = profile_of(prompts[rid], traces[rid]["plain"].output_tokens, model)[0]
        assert decision.reason.startswith(f"{profile.task}/t0: ")  # policies.options.reason_line
        assert decision.k == by_name[decision.pool].k
    warm = adaptive(costs, sequence, prompts, pools, "h100", 5, model, warmup=sliced)
    assert len(warm.decisions) == len(sequence) and warm.score > 0
    state = first.policy.refit()
    served = {name for (name, *_), n in state.traffic.items() if n > 0}
    assert served == {d.pool for d in first.decisions}


def test_the_learning_unit_reaches_the_worlds_policy(traces, prompts, sliced) -> None:
    """`bench traces --learning-unit pool`: the policy learns one acceptance per method
    for every class, and a decision carries the request's pooled scale, not its class's."""
    costs = Costs(traces, "h100", 1)
    model = traces[sliced[0]]["plain"].model
    pools = [PLAIN, PoolSpec("ngram", 4), PoolSpec("eagle", 2)]
    run = adaptive(costs, sliced * 2, prompts, pools, "h100", 0, model, unit="pool")
    state = run.policy.refit()
    assert state.pooled and {task for _, _, task, _ in state.acceptance} == {"any"}
    for rid, decision in zip(sliced * 2, run.decisions, strict=True):
        profile = profile_of(prompts[rid], traces[rid]["plain"].output_tokens, model)[0]
        family = "ngram" if decision.method == "ngram" else "eagle"
        expected = dict(profile.pooled_scales).get(family, 1.0) if decision.k else 1.0
        assert decision.accept_scale == expected


def test_per_request_k_pools_serve_at_the_decisions_k(traces, prompts, sliced) -> None:
    """The embedded engine's pools as `specroute up` launches them: one per method, k
    chosen per request; each request is served at its decision's k (0: a plain step), the
    score is the world's for exactly those (request, k) pairs, and the per-request best
    of the whole grid bounds it."""
    costs = Costs(traces, "embedded", 1)
    model = traces[sliced[0]]["plain"].model
    launched = [PLAIN, PoolSpec("ngram", 1), PoolSpec("eagle", 1)]
    sequence = sliced * 2
    run = adaptive(costs, sequence, prompts, launched, "embedded", 3, model, per_request_k=8)
    assert {d.pool for d in run.decisions} <= {"embedded-plain", "embedded-ngram",
                                                "embedded-eagle"}
    served = [(rid, PoolSpec(d.method, d.k) if d.k else PLAIN)
              for rid, d in zip(sequence, run.decisions, strict=True)]
    assert run.score == pytest.approx(costs.score(served))
    assert len({d.k for d in run.decisions if d.method == "ngram"}) > 1  # k varies
    anyk = best_by_group(costs, sequence, [str(i) for i in range(len(sequence))], grid(8))
    assert costs.score(list(zip(sequence, anyk, strict=True))) >= run.score * (1 - 1e-9)


def test_the_policy_reads_the_worlds_accept_length_at_smaller_k(traces, prompts, sliced) -> None:
    """Histograms reported by the pool (SGLang's spec_correct_drafts_histogram) give the
    policy the accept length at every k below the launch k (policies/accept_curve.py):
    what the world's walk yields at that k on the requests the pool served."""
    costs = Costs(traces, "h100", 1)
    model = traces[sliced[0]]["plain"].model
    ngram = PoolSpec("ngram", 8)
    run = adaptive(costs, sliced * 2, prompts, [PLAIN, ngram], "h100", 0, model)
    state = run.policy.refit()
    histogram = [0.0] * 9
    for (pool, k, *_), counts in state.accept_histograms.items():
        assert (pool, k) == ("ngram-k8", 8)
        for j, steps in enumerate(counts):
            histogram[j] += steps
    served = [rid for rid, d in zip(sliced * 2, run.decisions, strict=True)
              if d.pool == ngram.name]
    assert served
    for k in (1, 2, 4, 8):
        walked = [costs(rid, PoolSpec("ngram", k)) for rid in served]
        world = sum(w.tokens for w in walked) / sum(w.steps for w in walked)
        read = accept_length_at(histogram, 8, k)
        # exact where k + 1 divides 9 (a lower bound elsewhere: runs cut at 8 and gone on
        # would merge), but for the world's last step of a request, cut at its last token
        if k in (2, 8):
            assert read == pytest.approx(world, rel=0.02)
        assert read <= world * 1.02


def test_copy_heavy_shares_are_drawn_as_asked(traces, prompts) -> None:
    ids = usable(traces, prompts)
    category = {i: traces[i]["plain"].category for i in ids}
    for share in (0.0, 0.2, 0.4):
        drawn = mix_sequence(ids, category.__getitem__, share, 1)
        copy = sum(category[i] in COPY_HEAVY for i in drawn)
        assert len(drawn) == len(ids) and copy == round(share * len(ids))
    recorded = mix_sequence(ids, category.__getitem__, None, 1)
    assert sorted(recorded) == sorted(ids) and recorded != ids


def test_the_command_prints_the_ratios(prompts_file,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["bench", "traces", "--quick", "--json",
                                      "--prompts", str(prompts_file)])
    assert args.func(args) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert {(r["world"], r["batch"]) for r in report["results"]} == {
        (w, b) for w in ("h100", "embedded") for b in (1, 8, 32)}
    for row in report["results"]:
        for fleet in ("plain", "ngram", "eagle", "static", "oracle_class", "adaptive",
                      "adaptive_warm"):
            assert row[fleet]["high"] <= row["oracle_request"]["low"] + 1e-9
        if row["world"] == "embedded":  # the per-request-k pools, bounded by the grid's best
            for fleet in ("oracle_request", "prk", "prk_warm"):
                assert row[fleet]["high"] <= row["oracle_any_k"]["low"] + 1e-9
        else:
            assert "prk" not in row
        assert max(row["plain"]["mean"], row["ngram"]["mean"], row["eagle"]["mean"]) == \
            pytest.approx(1.0)
    assert report["desired_k"]
    for row in report["desired_k"]:  # the world's curve on the pool's own traffic
        if row["requests"]:
            assert row["curve"][str(row["k"])] == pytest.approx(1.0)
            assert row["curve"][str(row["curve_best"])] == max(row["curve"].values())
    # k 8 derived from the k 16 recording is the k 8 recording's acceptance within 2%
    for check in report["cut_check_k16_to_k8"].values():
        assert check["requests"] > 0
        assert check["derived_tokens_per_step"] == pytest.approx(
            check["recorded_tokens_per_step"], rel=0.02)
