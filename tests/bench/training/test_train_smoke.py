"""The training scripts end to end on a tiny config: base model, then its three drafters,
then an engine that serves every method from the folder they wrote."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from tiny_models import near_bigram_llama

from bench.training.drafters import train, train_drafters
from bench.training.drafters.bpe import train_tokenizer
from workers.embedded.chat_template import EOS
from workers.embedded.checkpoint import save_model
from workers.embedded.engine import Engine, SamplingParams
from workers.embedded.model import ModelConfig

VOCAB = 300


@pytest.fixture(autouse=True)
def restore_threads():
    """The scripts set torch's thread count from their config."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


def _tiny_corpus(workdir: Path) -> None:
    """What `train.prepare_data` caches (tokenizer.json + tokens.npz), from a few lines of
    text, so the scripts skip building the real corpus."""
    workdir.mkdir(parents=True)
    texts = [f"def f{i}(x):\n    return x * {i} + {i % 7}\n" for i in range(120)]
    texts += [f"the quick brown fox jumps over {i} lazy dogs" for i in range(120)]
    tok = train_tokenizer(texts, VOCAB)
    tok.save(str(workdir / "tokenizer.json"))
    ids: list[int] = []
    for enc in tok.encode_batch(texts * 2):
        ids.extend(enc.ids + [EOS])
    kinds = np.zeros(len(ids), dtype=np.uint8)
    np.savez(workdir / "tokens.npz", ids=np.array(ids, dtype=np.uint16), kinds=kinds)


def test_base_then_drafters_train_and_serve(tmp_path: Path) -> None:
    workdir, out = tmp_path / "base", tmp_path / "model"
    _tiny_corpus(workdir)
    base_cfg = train.TrainConfig(
        steps=2, batch_size=2, seq_len=16, warmup=1, vocab_size=VOCAB, ckpt_every=2, threads=1
    )
    model_cfg = ModelConfig(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    summary = train.train(base_cfg, model_cfg, workdir, out)
    assert summary["history"][-1]["step"] == 2 and (workdir / "ckpt.pt").exists()
    longer = train.TrainConfig(**{**vars(base_cfg), "steps": 4})
    resumed = train.train(longer, model_cfg, workdir, out)  # picks up at step 2
    assert [h["step"] for h in resumed["history"]] == [2, 4]
    assert resumed["history"][0] == summary["history"][0]
    assert {"config.json", "model.safetensors", "tokenizer.json", "training.json"} <= {
        p.name for p in out.iterdir()
    }

    drafter_cfg = train_drafters.DrafterTrainConfig(
        steps=2,
        batch_size=2,
        seq_len=16,
        warmup=1,
        medusa_heads=2,
        medusa_positions=4,
        draft_hidden=32,
        draft_layers=1,
        ckpt_every=2,
        threads=1,
    )
    report = train_drafters.train(drafter_cfg, out, tmp_path / "drafters", workdir)
    assert set(report["parameters"]) == {"medusa", "eagle", "draft"}
    for kind in ("medusa", "eagle", "draft"):
        assert (out / kind / "config.json").exists() and (out / kind / "model.safetensors").exists()

    engine = Engine(out, dtype=torch.float32)
    assert {"plain", "medusa", "eagle", "eagle2", "draft"} <= set(engine.methods)
    prompt = engine.tokenizer.encode("def f3(x):\n")
    outputs = set()
    for method in ("plain", "medusa", "eagle", "eagle2", "draft"):
        gen = engine.start(prompt, SamplingParams(max_new_tokens=8, ignore_eos=True), method)
        ids: list[int] = []
        while not gen.finished:
            ids += gen.step().token_ids
        outputs.add(tuple(ids))
    assert len(outputs) == 1 and len(outputs.pop()) == 8


def _near_bigram_base(folder: Path) -> None:
    """A random base whose residual blocks barely matter: its next token is (nearly) a
    function of the current one, something a few hundred drafter steps can learn."""
    save_model(near_bigram_llama(VOCAB, 128, 0.02), folder, dtype=torch.float32)


def test_briefly_trained_drafters_are_accepted(tmp_path: Path) -> None:
    """Training and drafting agree on who predicts what (EAGLE's (f_t, x_{t+1}) -> f_{t+1}
    pairs and positions, the draft model's targets): distilled for a few hundred steps on
    a near-bigram base, the drafters' greedy drafts get accepted, losslessly."""
    workdir, model_dir = tmp_path / "base", tmp_path / "model"
    _tiny_corpus(workdir)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(3, VOCAB, (20_000,), generator=gen).numpy().astype(np.uint16)
    np.savez(workdir / "tokens.npz", ids=ids, kinds=np.zeros(len(ids), dtype=np.uint8))
    _near_bigram_base(model_dir)
    shutil.copy(workdir / "tokenizer.json", model_dir / "tokenizer.json")
    cfg = train_drafters.DrafterTrainConfig(
        steps=300,
        batch_size=8,
        seq_len=32,
        lr=3e-3,
        warmup=20,
        medusa_heads=2,
        medusa_positions=8,
        draft_hidden=32,
        draft_layers=1,
        ckpt_every=300,
        threads=1,
    )
    train_drafters.train(cfg, model_dir, tmp_path / "drafters", workdir)
    engine = Engine(model_dir, dtype=torch.float32)
    prompts = torch.randint(3, VOCAB, (3, 8), generator=gen).tolist()
    for method, floor in (("eagle", 1.5), ("eagle2", 1.8), ("draft", 1.5)):
        accepted = []
        for prompt in prompts:
            outputs = []
            for name in ("plain", method):
                g = engine.start(prompt, SamplingParams(max_new_tokens=40, ignore_eos=True), name)
                ids_out: list[int] = []
                while not g.finished:
                    ids_out += g.step().token_ids
                outputs.append(ids_out)
            assert outputs[0] == outputs[1]
            accepted.append(g.stats.accept_length)
        assert sum(accepted) / len(accepted) > floor, (method, accepted)


def test_autocast_is_bf16_only_where_the_cpu_computes_it() -> None:
    """Emulated bf16 products are ~190x slower than float32 (AVX2): no autocast there."""
    import torch

    from bench.training.drafters.train import cpu_autocast, native_bf16

    a, b = torch.randn(4, 8), torch.randn(8, 2)
    with cpu_autocast():
        product = a @ b
    assert product.dtype == (torch.bfloat16 if native_bf16() else torch.float32)
