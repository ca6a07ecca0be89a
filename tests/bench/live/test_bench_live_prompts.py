"""The live bench measures prompts nothing was built from: not the prior (`measured.json`
and the batch costs), not the classifier's labelled set, not the drafters' training data
(self-distillation prompts and corpus documents); warm-up and measured prompts, and the
prompts of each replicate and concurrency, are pairwise disjoint. Each check also runs on
a draw that does overlap (the old live bench's), so it is known to fail when it should."""

from __future__ import annotations

import pytest

from bench.live.prompts import (
    CLASSES,
    MIXES,
    classifier_texts,
    drafter_documents,
    drafter_exclusion,
    plan,
    prior_texts,
    text_of,
)
from bench.workload import TASKS, _stdlib_functions, _stdlib_texts, modules, prompts

REPLICATES, CONCURRENCY = 3, (1, 4)


@pytest.fixture(scope="module")
def run_plan():
    return plan("m", per_class=4, warmup=60, concurrency=CONCURRENCY, replicates=REPLICATES,
                seed=0, max_tokens=32)


def _texts(items) -> list[str]:
    return [text_of(it.body) for it in items]


def test_every_class_of_every_mix_is_measured_with_its_shares_summing_to_one(run_plan) -> None:
    for shares in MIXES.values():
        assert sum(shares.values()) == pytest.approx(1.0) and set(shares) <= set(CLASSES)
    for items in run_plan.measured.values():
        assert sorted(it.cls for it in items) == sorted(c for c in CLASSES for _ in range(4))
        for cls in CLASSES:  # two folds of two prompts per class
            assert sorted(it.fold for it in items if it.cls == cls) == [0, 0, 1, 1]
        assert {it.body["temperature"] for it in items if it.cls == "chat/t0.7"} == {0.7}


def test_warm_up_replicates_and_concurrencies_are_disjoint(run_plan) -> None:
    groups = {"warm-up": _texts(run_plan.warmup)} | {
        f"r{r} c{c}": _texts(items) for (r, c), items in run_plan.measured.items()}
    assert len(groups) == 1 + REPLICATES * len(CONCURRENCY) and len(groups["warm-up"]) == 60
    every = [t for texts in groups.values() for t in texts]
    assert len(every) == len(set(every)), "a text is measured twice"


def test_no_measured_or_warm_up_prompt_fed_a_prior_or_the_classifier(run_plan) -> None:
    ours = {t for items in [run_plan.warmup, *run_plan.measured.values()] for t in _texts(items)}
    # measured.json: bench engine --prompts 2 --seed 0; costs: bench batching --seed 0
    prior = {m["content"] for task in TASKS for p in prompts(task, 8, 0) for m in p.messages}
    assert not ours & prior and not ours & prior_texts()
    assert not ours & classifier_texts()
    # the old live bench (seed 0, its first prompts) measured what the prior had seen
    old = {m["content"] for task in TASKS for p in prompts(task, 4, 0) for m in p.messages}
    assert old & prior


def test_bench_vllms_calibration_prompts_are_left_out_as_the_priors(run_plan) -> None:
    """`bench vllm --write-measured` writes a prior from its own prompts (at most
    `PRIOR_DRAWS` per class): every one is among the prior's texts, none is measured live."""
    from bench.engine.vllm import TASKS as VLLM_TASKS
    from bench.live.prompts import PRIOR_DRAWS, VLLM_CALIBRATION_SEED

    calibration = {m["content"] for task in VLLM_TASKS
                   for p in prompts(task, PRIOR_DRAWS, VLLM_CALIBRATION_SEED)
                   for m in p.messages}
    assert calibration <= prior_texts()
    ours = {t for items in [run_plan.warmup, *run_plan.measured.values()] for t in _texts(items)}
    assert not ours & calibration


def test_no_prompt_is_a_self_distillation_prompt(run_plan) -> None:
    from bench.training.drafters.distill_data import build_prompts

    distill = {item.text for item in build_prompts()}
    ours = {t for items in [run_plan.warmup, *run_plan.measured.values()] for t in _texts(items)}
    assert not ours & distill


def test_no_prompt_is_built_from_a_drafter_training_document() -> None:
    docs = drafter_documents()
    assert len(docs) == 240  # the SmolLM2 drafters' --corpus-docs 240
    code = {text for kind, text in docs if kind == "code"}
    flat = [" ".join(text.split()) for _, text in docs]
    exclusion = drafter_exclusion()
    import sysconfig
    from pathlib import Path

    root = Path(sysconfig.get_paths()["stdlib"])
    for module in modules(exclusion):  # no file the heads were trained on
        assert (root / module).read_text(encoding="utf-8") not in code
    paragraphs, sources = _stdlib_texts(exclusion)
    for text in (*paragraphs, *sources):  # no docstring or function inside a training text
        assert not any(" ".join(text.split()) in d for d in flat)
    # the workload's names: only from modules whose file was not trained on
    kept = {name for name, _ in _stdlib_functions(exclusion)}
    assert kept and kept <= {name for name, _ in _stdlib_functions()}
    # without the exclusion the workload does overlap (so the checks above can fail)
    assert set(modules()) - set(modules(exclusion)) == set(exclusion.modules) != set()
    every_paragraph, every_source = _stdlib_texts()
    assert any(any(" ".join(s.split()) in d for d in flat) for s in every_source)


def _held_out_file(tmp_path, per_category: int):
    """A prompts file in bench.traces.heldout's shape, its texts written here."""
    import json

    from bench.live.prompts import COPY_HEAVY, NO_COPY

    rows = [{"id": f"{c}:{i}", "category": c,
             "messages": [{"role": "user", "content": f"{c} question number {i}"}]}
            for c in (*NO_COPY, *COPY_HEAVY) for i in range(per_category)]
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_held_out_classes_draw_their_category_and_never_a_prompt_twice(tmp_path) -> None:
    from bench.live.prompts import HELD_OUT_CLASSES, HELD_OUT_MIXES

    path = _held_out_file(tmp_path, per_category=8)
    got = plan("m", per_class=2, warmup=10, concurrency=(1,), replicates=3, seed=5,
               max_tokens=32, classes=HELD_OUT_CLASSES, prompts_file=str(path))
    for shares in HELD_OUT_MIXES.values():
        assert sum(shares.values()) == pytest.approx(1.0) and set(shares) <= set(HELD_OUT_CLASSES)
    measured = [it for items in got.measured.values() for it in items]
    assert len(measured) == 3 * 2 * len(HELD_OUT_CLASSES)
    for it in measured:  # each prompt is its class's category, greedy, at the run's budget
        category = it.cls.removeprefix("heldout:").removesuffix("/t0")
        assert text_of(it.body).startswith(f"{category} question")
        assert it.body["temperature"] == 0.0 and it.body["max_tokens"] == 32
    texts = _texts(measured)
    assert len(set(texts)) == len(texts)
    # the warm-up learns from the workload's own prompts, never a held-out one
    assert got.warmup and not {text_of(it.body) for it in got.warmup} & set(texts)
    assert all(it.cls in CLASSES for it in got.warmup)


def test_too_few_held_out_prompts_for_the_replicates_is_refused(tmp_path) -> None:
    from bench.live.prompts import HELD_OUT_CLASSES

    path = _held_out_file(tmp_path, per_category=3)
    with pytest.raises(ValueError, match="fewer than 2 unused held-out prompts"):
        plan("m", per_class=2, warmup=0, concurrency=(1,), replicates=2, seed=5,
             max_tokens=32, classes=HELD_OUT_CLASSES, prompts_file=str(path))
