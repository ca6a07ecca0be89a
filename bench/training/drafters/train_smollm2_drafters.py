"""Distil an EAGLE head and Medusa heads for SmolLM2-135M-Instruct from its own outputs.

    python -m bench.training.drafters.train_smollm2_drafters [--steps N] [--corpus-docs D]
    python -m bench.training.drafters.train_smollm2_drafters --resume [--steps N]
    python -m bench.training.drafters.train_smollm2_drafters --init-from DIR [--lr 3e-4]
    python -m bench.training.drafters.train_smollm2_drafters --export [--checkpoint last]

Data: the self-distillation shards of `distill_data` (prompt + the target's own response,
greedy and T=0.8), plus, with --corpus-docs D, D teacher-forced documents of the bundled
corpus (`corpus.py`: standard-library code, docstrings, JSON) rendered as ChatML
assistant turns (`corpus_shards`): the target's features and argmax over fixed text, as
EAGLE-1 trained on ShareGPT; one forward per document instead of one per token. The
frozen target runs once per shard (`smollm2_data.cached_features`, kept under --features,
so a resumed run reuses them). The first --holdout-shards of each --shards folder are
held out for agreement. `magpie` shards (prompts the target wrote, `magpie.py`) are read
like the distillation's: `--shards runs/smollm2-distill runs/smollm2-magpie`.

Draft vocabulary (FR-Spec, arXiv 2502.14856): the N most frequent tokens of the training
shards; each drafter owns an (N, C) projection initialised from those rows of the tied
embedding. Teacher distributions are the target's softmax over the same N rows, computed
from the cached features.

Students, trained together (`Students`):
- EAGLE head (arXiv 2401.15077): (f_t, e(x_{t+1})) -> f_{t+1}; smooth-L1 feature regression
  plus soft cross-entropy against the target's next-token distribution, with feature
  noise; a second unrolled pass feeds the head its own predictions, as drafting does at
  depth >= 2 (HASS, arXiv 2408.15766; EAGLE-3's training-time test).
- Medusa heads (arXiv 2401.10774): head i at position t matches the target's distribution
  for x_{t+2+i}.
--init-from starts both students from shipped drafters (and their draft vocabulary), and
scores them on this run's held-out set as step 0, so a checkpoint is "best" only if it
beats what ships. Checkpoint every `ckpt_every` steps (`workdir/ckpt.pt`, resumed with --resume) plus the
best by held-out EAGLE agreement (`workdir/best.pt`), which --export ships.

Legend: B sequences, T positions, C hidden size, N draft vocabulary, V vocabulary.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from bench.training.drafters.smollm2_data import (
    Batch,
    ShardFeatures,
    corpus_shards,
    coverage,
    make_batch,
    prepare,
    split_shards,
)
from bench.training.drafters.train import cpu_autocast, load_checkpoint, save_checkpoint
from workers.embedded.checkpoint import init_weights, load_model
from workers.embedded.drafter_models import (
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    save_drafter,
)
from workers.embedded.model import ModelConfig
from workers.models import SMOLLM2_MODEL_NAME, weights_dir

SHIPPED_DIR = weights_dir(SMOLLM2_MODEL_NAME)


@dataclass(frozen=True)
class SmolDrafterConfig:
    steps: int = 600
    batch_size: int = 8  # sequences per step
    max_len: int = 320  # positions per sequence (prompt + response), cropped
    lr: float = 1e-3
    warmup: int = 30
    draft_vocab: int = 8192
    medusa_heads: int = 4
    medusa_positions: int = 48  # sampled positions per sequence for the Medusa loss
    eagle_token_weight: float = 0.5
    eagle_unroll_weight: float = 0.5  # passes on the head's own predictions; 0 = off
    eagle_unroll_steps: int = 1  # such passes (depths 2 .. 1 + steps)
    eagle_noise: float = 0.05
    holdout_shards: int = 1
    ckpt_every: int = 50
    seed: int = 0
    init_from: str = ""  # a folder of shipped drafters (eagle/, medusa/) to start from
    # Written into the exported head's config, for serving: the chain cutoff
    # (`EagleConfig.chain_confidence`), measured on SmolLM2's head (docs/results/
    # 2026-12-05-engine-vllm.md, section 2).
    chain_confidence: float = 0.1


# ---------------------------------------------------------------- phase 2: students


class Students(torch.nn.Module):
    def __init__(self, base: ModelConfig, cfg: SmolDrafterConfig) -> None:
        super().__init__()
        self.eagle = EagleHead(EagleConfig(
            hidden_size=base.hidden_size, intermediate_size=base.intermediate_size,
            num_attention_heads=base.num_attention_heads,
            num_key_value_heads=base.num_key_value_heads,
            max_position_embeddings=base.max_position_embeddings, rms_norm_eps=base.rms_norm_eps,
            rope_theta=base.rope_theta, vocab_size=base.vocab_size,
            draft_vocab_size=cfg.draft_vocab, chain_confidence=cfg.chain_confidence))
        self.medusa = MedusaHeads(MedusaConfig(
            hidden_size=base.hidden_size, num_heads=cfg.medusa_heads, vocab_size=base.vocab_size,
            draft_vocab_size=cfg.draft_vocab))
        init_weights(self.eagle.layer, std=0.02)

    def set_vocabulary(self, vocab: torch.Tensor, embed: torch.Tensor) -> None:
        """Both projections start as the tied embedding's rows for `vocab`."""
        for module in (self.eagle, self.medusa):
            assert module.vocabulary is not None
            module.vocabulary.draft_vocab.copy_(vocab)
            with torch.no_grad():
                module.vocabulary.proj.weight.copy_(embed[vocab])


def soft_ce(logits: torch.Tensor, teacher: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Mean over weighted positions of cross-entropy against softmax(teacher)."""
    per = -(teacher.float().softmax(-1) * logits.float().log_softmax(-1)).sum(-1)
    return (per * weight).sum() / weight.sum().clamp_min(1)


def regression(pred: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Smooth-L1 feature loss (EAGLE), mean over weighted positions."""
    per = F.smooth_l1_loss(pred.float(), target, reduction="none").mean(-1)
    return (per * weight).sum() / weight.sum().clamp_min(1)


def hits(logits: torch.Tensor, vocab: torch.Tensor, argmax: torch.Tensor,
         weight: torch.Tensor) -> tuple[float, float]:
    """(matches, positions): draft argmax (mapped to token ids) equal to the target's argmax."""
    match = (vocab[logits.argmax(-1)] == argmax).float() * weight
    return match.sum().item(), weight.sum().item()


def losses(students: Students, base_rows: torch.Tensor, embed: torch.Tensor, batch: Batch,
           cfg: SmolDrafterConfig, gen: torch.Generator | None,
           ) -> tuple[torch.Tensor, dict[str, float]]:
    """Total loss and stats; gen None = evaluation (no noise, all positions)."""
    eagle, medusa = students.eagle, students.medusa
    assert eagle.vocabulary is not None and medusa.vocabulary is not None
    vocab = eagle.vocabulary.draft_vocab
    f, x, valid = batch.hidden, batch.tokens, batch.valid.float()
    teacher = f @ base_rows.T  # (B, T, N): target logits over the draft vocabulary
    stats: dict[str, float] = {}
    with cpu_autocast():  # bf16 only where the CPU has it (train.native_bf16)
        # EAGLE pass 1 at t: (f_t, e(x_{t+1})) -> f_{t+1}, whose logits predict x_{t+2}.
        w1 = valid[:, 1:]  # (B, T-1)
        inputs = f[:, :-1]
        if gen is not None:
            inputs = inputs + cfg.eagle_noise * torch.randn(inputs.shape, generator=gen)
        pred = eagle(inputs, F.embedding(x[:, 1:], embed))  # (B, T-1, C)
        regress = regression(pred, f[:, 1:], w1)
        logits = eagle.vocabulary.proj(pred)  # (B, T-1, N)
        eagle_loss = regress + cfg.eagle_token_weight * soft_ce(logits, teacher[:, 1:], w1)
        m, n = hits(logits, vocab, batch.argmax[:, 1:], w1)
        stats.update(eagle_regress=regress.item(), eagle=m / max(n, 1))
        # Passes 2.. at t >= d - 1: (the previous pass's h_t, e(x_{t+1})) -> f_{t+1}, as at
        # draft depth d (HASS; EAGLE-3's training-time test), each weighted
        # eagle_unroll_weight.
        previous, extra = pred, cfg.eagle_unroll_steps if cfg.eagle_unroll_weight > 0 else 0
        for depth in range(2, 2 + extra):
            wd = valid[:, depth:]
            pred_d = eagle(previous[:, :-1], F.embedding(x[:, depth:], embed))  # (B, T-d, C)
            regress_d = regression(pred_d, f[:, depth:], wd)
            logits_d = eagle.vocabulary.proj(pred_d)
            eagle_loss = eagle_loss + cfg.eagle_unroll_weight * (
                regress_d + cfg.eagle_token_weight * soft_ce(logits_d, teacher[:, depth:], wd))
            m, n = hits(logits_d, vocab, batch.argmax[:, depth:], wd)
            stats[f"eagle_depth{depth}"] = m / max(n, 1)
            previous = pred_d
        # Medusa: head i at p predicts x_{p+2+i}: the target's distribution after f_{p+1+i}.
        t = f.shape[1]
        span = t - 1 - cfg.medusa_heads
        if gen is not None:
            pos = torch.randint(0, span, (min(cfg.medusa_positions, span),), generator=gen)
        else:
            pos = torch.arange(span)
        head_feats = medusa(f[:, pos])  # (H, B, P, C)
        medusa_loss = torch.zeros(())
        for i in range(cfg.medusa_heads):
            w = valid[:, pos + 1 + i]
            head_logits = medusa.vocabulary.proj(head_feats[i])
            medusa_loss = medusa_loss + 0.8**i * soft_ce(head_logits, teacher[:, pos + 1 + i], w)
            m, n = hits(head_logits, vocab, batch.argmax[:, pos + 1 + i], w)
            stats[f"medusa{i}"] = m / max(n, 1)
    stats.update(eagle_loss=eagle_loss.item(), medusa_loss=medusa_loss.item())
    return eagle_loss + medusa_loss, stats


@torch.no_grad()
def evaluate(students: Students, base_rows: torch.Tensor, embed: torch.Tensor, data: ShardFeatures,
             cfg: SmolDrafterConfig) -> dict[str, float]:
    """Held-out agreement with the target's argmax (position-weighted over sequences)."""
    totals: dict[str, float] = {}
    seqs = list(range(len(data.tokens)))
    for s in range(0, len(seqs), cfg.batch_size):
        batch = make_batch(data, seqs[s : s + cfg.batch_size])
        _, stats = losses(students, base_rows, embed, batch, cfg, None)
        for key, value in stats.items():
            totals[key] = totals.get(key, 0.0) + value / math.ceil(len(seqs) / cfg.batch_size)
    return {f"heldout_{k}": round(v, 4) for k, v in totals.items()}


def lr_at(step: int, cfg: SmolDrafterConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = min(1.0, (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup))
    return 0.1 * cfg.lr + 0.45 * cfg.lr * (1 + math.cos(math.pi * progress))


def shipped_state(folder: Path, kind: str) -> dict[str, torch.Tensor]:
    """A shipped drafter's weights (`save_drafter`'s bf16) as float32 tensors."""
    from safetensors.torch import load_file

    state = load_file(str(folder / kind / "model.safetensors"))
    return {k: v.float() if v.is_floating_point() else v for k, v in state.items()}


def warm_start(students: Students, folder: Path) -> None:
    """Start from shipped drafters: fine-tuning on more data, not training anew."""
    students.eagle.load_state_dict(shipped_state(folder, "eagle"))
    students.medusa.load_state_dict(shipped_state(folder, "medusa"))


def train(cfg: SmolDrafterConfig, model_dir: Path, shards: list[Path],
          heldout_shards: list[Path], workdir: Path, cache_dir: Path, resume: bool) -> dict:
    """Train on `shards`; agreement on `heldout_shards` (`smollm2_data.split_shards`)."""
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "ckpt.pt").exists() and not resume:
        raise SystemExit(f"{workdir}/ckpt.pt exists: pass --resume, or another --workdir")
    vocab_file = workdir / "draft_vocab.pt"
    if cfg.init_from and not vocab_file.exists():  # the shipped drafters' vocabulary
        vocab = shipped_state(Path(cfg.init_from), "eagle")["vocabulary.draft_vocab"]
        torch.save(vocab, vocab_file)
    base = load_model(model_dir, dtype=torch.float32).fuse()  # the engine's features
    train_data, heldout, vocab = prepare(base, shards, heldout_shards, cache_dir, vocab_file,
                                         cfg.max_len, cfg.draft_vocab)
    embed = base.model.embed_tokens.weight.detach()  # (V, C) tied: also the LM head
    base_rows = embed[vocab].float()  # (N, C)
    n_train = sum(len(t) for t in train_data.tokens)
    print(f"{len(shards)} + {len(heldout_shards)} shards: {len(train_data.tokens)} train "
          f"sequences ({n_train} positions), "
          f"{len(heldout.tokens)} held out; draft vocabulary {len(vocab)} covers "
          f"{coverage(heldout, vocab, base.config.vocab_size):.3f} of held-out target tokens",
          flush=True)
    torch.manual_seed(cfg.seed)
    students = Students(base.config, cfg)
    students.set_vocabulary(vocab, embed)
    if cfg.init_from:
        warm_start(students, Path(cfg.init_from))
    del base
    data = {"shards": [str(s) for s in shards], "heldout_shards": [str(s) for s in heldout_shards],
            "train_sequences": len(train_data.tokens),
            "train_positions": n_train, "heldout_sequences": len(heldout.tokens),
            "heldout_positions": sum(len(t) for t in heldout.tokens)}
    (workdir / "data.json").write_text(json.dumps(data, indent=2) + "\n")
    opt = torch.optim.AdamW(students.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, history = load_checkpoint(workdir, students, opt, gen)
    if cfg.init_from and step == 0:  # what the shipped drafters score on this held-out set
        history.append({"step": 0, "wall_s": 0,
                        **evaluate(students, base_rows, embed, heldout, cfg)})
        print(f"eval step 0 (shipped): {json.dumps(history[-1])}", flush=True)
    best = max((h.get("heldout_eagle", 0.0) for h in history), default=0.0)
    t0, done = time.time(), 0
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        index = torch.randint(0, len(train_data.tokens), (cfg.batch_size,), generator=gen).tolist()
        loss, stats = losses(students, base_rows, embed, make_batch(train_data, index), cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(students.parameters(), 1.0)
        opt.step()
        step, done = step + 1, done + 1
        if step % 10 == 0 or step == cfg.steps:
            per_step = (time.time() - t0) / done
            shown = " ".join(f"{k} {v:.3f}" for k, v in stats.items())
            print(f"step {step}/{cfg.steps} {shown} {per_step:.1f}s/step "
                  f"eta {(cfg.steps - step) * per_step / 60:.1f} min", flush=True)
        if step % cfg.ckpt_every == 0 or step == cfg.steps:
            held = evaluate(students, base_rows, embed, heldout, cfg)
            history.append({"step": step, "wall_s": round(time.time() - t0), **held,
                            **{k: round(v, 4) for k, v in stats.items()}})
            print(f"eval step {step}: {json.dumps(held)}", flush=True)
            save_checkpoint(workdir, students, opt, gen, step, history)
            if held["heldout_eagle"] >= best:
                best = held["heldout_eagle"]
                torch.save({"model": students.state_dict(), "step": step}, workdir / "best.tmp")
                (workdir / "best.tmp").replace(workdir / "best.pt")
    summary = {"train_config": asdict(cfg), **data, "history": history}
    (workdir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def export(workdir: Path, out: Path, checkpoint: str = "best") -> dict:
    """Ship `workdir/best.pt` (else ckpt.pt), or with checkpoint="last" ckpt.pt, as
    out/eagle, out/medusa and out/drafters.json."""
    best = workdir / "best.pt"
    ckpt = best if checkpoint == "best" and best.exists() else workdir / "ckpt.pt"
    state = torch.load(ckpt, weights_only=False)
    raw = json.loads((workdir / "run.json").read_text())
    cfg = SmolDrafterConfig(**raw["train_config"])
    base_cfg = ModelConfig.from_dict(raw["base_config"])
    students = Students(base_cfg, cfg)
    students.load_state_dict(state["model"])
    save_drafter(students.eagle, "eagle", out / "eagle")
    save_drafter(students.medusa, "medusa", out / "medusa")
    ckpt_state = torch.load(workdir / "ckpt.pt", weights_only=False)
    summary = {"train_config": asdict(cfg), "exported_step": state["step"],
               "steps_run": ckpt_state["step"], "history": ckpt_state["history"],
               **json.loads((workdir / "data.json").read_text()),
               "parameters": {name: sum(p.numel() for p in getattr(students, name).parameters())
                              for name in ("eagle", "medusa")}}
    (out / "drafters.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    defaults = SmolDrafterConfig()
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--lr", type=float, default=defaults.lr)
    p.add_argument("--draft-vocab", type=int, default=defaults.draft_vocab)
    p.add_argument("--eagle-unroll-weight", type=float, default=defaults.eagle_unroll_weight)
    p.add_argument("--eagle-unroll-steps", type=int, default=defaults.eagle_unroll_steps)
    p.add_argument("--holdout-shards", type=int, nargs="+", default=[defaults.holdout_shards],
                   help="shards held out for agreement: one count for every --shards "
                        "folder, or one count each")
    p.add_argument("--ckpt-every", type=int, default=defaults.ckpt_every)
    p.add_argument("--max-shards", type=int, default=10_000,
                   help="use the first N shards of each folder")
    p.add_argument("--corpus-docs", type=int, default=0,
                   help="teacher-forced corpus documents to add")
    p.add_argument("--model", type=Path, default=None,
                   help="base folder (default: ensure_smollm2())")
    p.add_argument("--shards", type=Path, nargs="+", default=[Path("runs/smollm2-distill")],
                   help="folders of distill_data (shard-*) or magpie (magpie-*) shards")
    p.add_argument("--workdir", type=Path, default=Path("runs/smollm2-drafters"))
    p.add_argument("--features", type=Path, default=Path("runs/smollm2-features"),
                   help="per-shard target features, shared between runs")
    p.add_argument("--resume", action="store_true", help="continue from workdir/ckpt.pt")
    p.add_argument("--init-from", type=Path, default=None,
                   help="start from the drafters shipped in this folder (their vocabulary too)")
    p.add_argument("--export", action="store_true", help="ship a checkpoint of workdir and exit")
    p.add_argument("--checkpoint", choices=("best", "last"), default="best",
                   help="--export: best held-out EAGLE agreement, or the last step")
    p.add_argument("--out", type=Path, default=SHIPPED_DIR)
    args = p.parse_args(argv)
    if args.export:
        print(json.dumps(export(args.workdir, args.out, args.checkpoint)["parameters"]))
        return 0
    model_dir = args.model
    if model_dir is None:
        from workers.embedded.fetch_model import ensure_smollm2

        model_dir = ensure_smollm2()
    run_file = args.workdir / "run.json"
    if args.resume and run_file.exists():
        saved = json.loads(run_file.read_text())["train_config"]
        cfg = SmolDrafterConfig(**{**saved, "steps": args.steps})
    else:
        cfg = SmolDrafterConfig(steps=args.steps, batch_size=args.batch_size, lr=args.lr,
                                draft_vocab=args.draft_vocab, ckpt_every=args.ckpt_every,
                                eagle_unroll_weight=args.eagle_unroll_weight,
                                eagle_unroll_steps=args.eagle_unroll_steps,
                                holdout_shards=args.holdout_shards[0],
                                init_from=str(args.init_from or ""))
    args.workdir.mkdir(parents=True, exist_ok=True)
    base_config = json.loads((Path(model_dir) / "config.json").read_text())
    run = {"train_config": asdict(cfg), "base_config": base_config}
    run_file.write_text(json.dumps(run, indent=2) + "\n")
    shards, heldout = split_shards(args.shards, args.holdout_shards, args.max_shards)
    if args.corpus_docs:
        shards += corpus_shards(Path(model_dir), Path(f"{args.shards[0]}-corpus"), args.corpus_docs)
    train(cfg, Path(model_dir), shards, heldout, args.workdir, args.features, args.resume)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
