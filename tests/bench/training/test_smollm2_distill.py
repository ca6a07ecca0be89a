"""The self-distillation prompt set and its generator: a few thousand prompts over the three
tasks, none of them a benchmark prompt; shards hold what the drafters train on, and a
restart resumes instead of redoing."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest
import torch

from bench.training.drafters.distill_data import build_prompts, run
from bench.workload import TASKS, prompts
from workers.embedded.fetch_model import ensure_smollm2


@pytest.fixture(scope="module")
def items():
    return build_prompts()


def test_a_few_thousand_prompts_over_the_three_tasks(items) -> None:
    counts = Counter(item.task for item in items)
    assert 2000 <= len(items) <= 5000 and set(counts) == {"code", "structured", "chat"}
    assert min(counts.values()) >= 300
    assert len({item.text for item in items}) == len(items)


def test_no_benchmark_prompt_is_trained_on(items) -> None:
    texts = {item.text for item in items}
    for task in TASKS:
        for seed in (0, 1, 7, 123):  # seeds beyond those excluded at build time
            bench = {m["content"] for p in prompts(task, 500, seed) for m in p.messages}
            assert not texts & bench


def test_shards_hold_the_targets_answers_and_a_restart_resumes(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=3, limit=1)
    shard = tmp_path / "shard-00000.jsonl"
    rows = [json.loads(line) for line in shard.read_text().splitlines()]
    assert 1 <= len(rows) <= 2
    for row in rows:
        assert row["prompt_ids"][0] == 1  # <|im_start|>system ... ending <|im_start|>assistant\n
        assert row["prompt_ids"][-4:] == [1, 520, 9531, 198]
        assert 1 <= len(row["response_ids"]) <= 3 and row["task"] in TASKS
        assert row["finish"] in ("stop", "length") and row["temperature"] in (0.0, 0.8)
    before = shard.stat().st_mtime_ns
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=3, limit=1)
    assert shard.stat().st_mtime_ns == before and sorted(p.name for p in tmp_path.iterdir()) == [shard.name]


def test_parts_split_the_batches_between_processes(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=2, limit=3, part=(1, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard-00001.jsonl"]
    run(tmp_path, ensure_smollm2(), batch_size=2, max_new=2, limit=3, part=(0, 2))
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"shard-0000{i}.jsonl" for i in range(3)]


def test_eagle_training_unrolls_to_the_depth_asked() -> None:
    from bench.training.drafters.smollm2_data import Batch
    from bench.training.drafters.train_smollm2_drafters import SmolDrafterConfig, Students, losses
    from workers.embedded.model import ModelConfig

    base = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64)
    cfg = SmolDrafterConfig(draft_vocab=16, medusa_heads=2, medusa_positions=4,
                            eagle_unroll_steps=3)
    students = Students(base, cfg)
    embed = torch.randn(64, 32)
    students.set_vocabulary(torch.arange(16), embed)
    b, t = 2, 12
    batch = Batch(tokens=torch.randint(0, 64, (b, t)), hidden=torch.randn(b, t, 32),
                  argmax=torch.randint(0, 64, (b, t)), valid=torch.ones(b, t, dtype=torch.bool))
    loss, stats = losses(students, embed[:16], embed, batch, cfg, torch.Generator().manual_seed(0))
    assert {"eagle", "eagle_depth2", "eagle_depth3", "eagle_depth4"} <= set(stats)
    loss.backward()  # every pass reaches the head's parameters
    assert students.eagle.layer.self_attn.q_proj.weight.grad is not None
    off = dict(cfg.__dict__, eagle_unroll_weight=0.0)
    _, plain = losses(students, embed[:16], embed, batch, SmolDrafterConfig(**off), None)
    assert "eagle_depth2" not in plain


def test_a_warm_start_takes_the_shipped_drafters_as_saved(tmp_path: Path) -> None:
    from bench.training.drafters.train_smollm2_drafters import (
        SmolDrafterConfig,
        Students,
        shipped_state,
        warm_start,
    )
    from workers.embedded.drafter_models import save_drafter
    from workers.embedded.model import ModelConfig

    base = ModelConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64)
    cfg = SmolDrafterConfig(draft_vocab=16, medusa_heads=2)
    shipped = Students(base, cfg)
    shipped.set_vocabulary(torch.randperm(64)[:16], torch.randn(64, 32))
    save_drafter(shipped.eagle, "eagle", tmp_path / "eagle")
    save_drafter(shipped.medusa, "medusa", tmp_path / "medusa")
    fresh = Students(base, cfg)
    fresh.set_vocabulary(torch.arange(16), torch.randn(64, 32))
    warm_start(fresh, tmp_path)
    assert torch.equal(fresh.eagle.vocabulary.draft_vocab, shipped.eagle.vocabulary.draft_vocab)
    for kind in ("eagle", "medusa"):
        saved = shipped_state(tmp_path, kind)  # bf16 on disk: equal to what was saved
        assert all(torch.equal(v, saved[k])
                   for k, v in getattr(fresh, kind).state_dict().items())


def test_held_out_shards_come_from_every_folder(tmp_path: Path) -> None:
    from bench.training.drafters.smollm2_data import split_shards

    distill, magpie = tmp_path / "distill", tmp_path / "magpie"
    for folder, pattern, n in ((distill, "shard-{:05d}.jsonl", 4), (magpie, "magpie-{:05d}.jsonl", 5)):
        folder.mkdir()
        for i in range(n):
            (folder / pattern.format(i)).write_text("")
    (magpie / "queries.jsonl").write_text("")  # not a shard
    train, heldout = split_shards([distill, magpie], [1, 2])
    assert [p.name for p in heldout] == ["shard-00000.jsonl", "magpie-00000.jsonl", "magpie-00001.jsonl"]
    assert [p.name for p in train] == [f"shard-0000{i}.jsonl" for i in (1, 2, 3)] + \
        [f"magpie-0000{i}.jsonl" for i in (2, 3, 4)]
    train, heldout = split_shards([distill, magpie], [1], max_shards=3)
    assert len(heldout) == 2 and len(train) == 4
    with pytest.raises(ValueError):
        split_shards([distill, magpie], [1, 2, 3])


def test_a_second_draw_sets_shards_are_found_under_their_own_names(tmp_path: Path) -> None:
    from bench.training.drafters.magpie import shard_stem
    from bench.training.drafters.smollm2_data import split_shards

    assert shard_stem(0, 7) == "magpie-00007" and shard_stem(1, 7) == "magpie1-00007"
    for i in range(3):
        (tmp_path / f"{shard_stem(1, i)}.jsonl").write_text("")
    train, heldout = split_shards([tmp_path], [1])
    assert [p.name for p in heldout + train] == [f"magpie1-0000{i}.jsonl" for i in range(3)]


def test_cached_features_of_another_shard_with_the_same_name_are_computed_again(tmp_path: Path) -> None:
    """Two folders' `magpie-00000.jsonl` once shared a cache entry: the second folder
    trained on the first's features. The cache now checks the tokens it holds."""
    from bench.training.drafters.smollm2_data import cached_features
    from workers.embedded.checkpoint import load_model

    base = load_model(ensure_smollm2(), dtype=torch.float32).fuse()
    cache = tmp_path / "features"
    cache.mkdir()
    row = {"prompt_ids": [1, 9690, 198], "response_ids": [504, 3158, 2]}
    first, second = tmp_path / "a" / "magpie-00000.jsonl", tmp_path / "b" / "magpie-00000.jsonl"
    for path, ids in ((first, row), (second, {**row, "response_ids": [1229, 2]})):
        path.parent.mkdir()
        path.write_text(json.dumps(ids) + "\n")
    a = cached_features(base, first, cache, 320)
    assert [t.tolist() for t in a.tokens] == [[1, 9690, 198, 504, 3158, 2]]
    b = cached_features(base, second, cache, 320)
    assert [t.tolist() for t in b.tokens] == [[1, 9690, 198, 1229, 2]]
    again = cached_features(base, second, cache, 320)  # now from the cache, the same
    assert all(torch.equal(x, y) for x, y in zip(again.hidden, b.hidden, strict=True))
