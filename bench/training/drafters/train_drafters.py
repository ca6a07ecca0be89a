"""Train the three drafters of the bundled model against its frozen base, in one loop.

    python -m bench.training.drafters.train_drafters [--steps N] [--model DIR] [--workdir runs/drafters]

Every step runs the frozen base once over a batch of corpus windows and distils it into:
- Medusa heads (arXiv 2401.10774), head i matching the base's distribution for token t+2+i
  (self-distillation: soft targets from the base, no ground-truth labels);
- the EAGLE head (arXiv 2401.15077): feature regression (smooth L1 to f_{t+1}) plus 0.1 x the
  token loss through the base's LM head, with feature noise as in the paper;
- a small draft model (same tokenizer) trained on the base's soft targets.
Resumable from `workdir/ckpt.pt`; progress lines show losses, teacher-agreement, ETA.
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

from bench.training.drafters.train import (
    TrainConfig,
    batch,
    cpu_autocast,
    load_checkpoint,
    prepare_data,
    save_checkpoint,
    split,
)
from workers.embedded.checkpoint import init_weights, load_model, save_model
from workers.embedded.drafter_models import (
    EagleConfig,
    EagleHead,
    MedusaConfig,
    MedusaHeads,
    save_drafter,
)
from workers.embedded.engine import BUNDLED_MODEL_DIR
from workers.embedded.model import LlamaForCausalLM, ModelConfig


@dataclass
class DrafterTrainConfig:
    steps: int = 1200
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 50
    medusa_heads: int = 4
    medusa_positions: int = 64  # sampled positions per sequence for the Medusa loss
    eagle_token_weight: float = 0.1
    eagle_noise: float = 0.05
    draft_hidden: int = 128
    draft_layers: int = 2
    ckpt_every: int = 100
    threads: int = 2
    seed: int = 0


def soft_ce(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Cross-entropy against the teacher's distribution (= KL up to the teacher's entropy)."""
    target = teacher_logits.float().softmax(-1)
    return -(target * logits.float().log_softmax(-1)).sum(-1).mean()


def agreement(logits: torch.Tensor, teacher_logits: torch.Tensor) -> float:
    return (logits.argmax(-1) == teacher_logits.argmax(-1)).float().mean().item()


def draft_model_config(base: ModelConfig, cfg: DrafterTrainConfig) -> ModelConfig:
    h = cfg.draft_hidden
    return ModelConfig(vocab_size=base.vocab_size, hidden_size=h, intermediate_size=int(h * 2.75),
                       num_hidden_layers=cfg.draft_layers, num_attention_heads=max(1, h // 32),
                       num_key_value_heads=max(1, h // 64),
                       max_position_embeddings=base.max_position_embeddings)


class Students(torch.nn.Module):
    def __init__(self, base: ModelConfig, cfg: DrafterTrainConfig) -> None:
        super().__init__()
        self.medusa = MedusaHeads(MedusaConfig(hidden_size=base.hidden_size, num_heads=cfg.medusa_heads))
        self.eagle = EagleHead(EagleConfig(
            hidden_size=base.hidden_size, intermediate_size=base.intermediate_size,
            num_attention_heads=base.num_attention_heads, num_key_value_heads=base.num_key_value_heads,
            max_position_embeddings=base.max_position_embeddings, rms_norm_eps=base.rms_norm_eps,
            rope_theta=base.rope_theta))
        self.draft = LlamaForCausalLM(draft_model_config(base, cfg))
        init_weights(self.draft)
        init_weights(self.eagle.layer, std=0.02)


def losses(students: Students, base: LlamaForCausalLM, xy: torch.Tensor, cfg: DrafterTrainConfig,
           gen: torch.Generator) -> tuple[torch.Tensor, dict]:
    x = xy[:, :-1]  # (B, T)
    with torch.inference_mode():
        out = base(x)
    teacher = out.logits.clone()  # (B, T, V): teacher[t] predicts x_{t+1}
    feats = out.hidden.float().clone()  # (B, T, C)
    lm_head = base.lm_head.weight.float().detach()  # (V, C)
    embed = base.model.embed_tokens.weight.float().detach()
    b, t, _ = feats.shape
    stats: dict[str, float] = {}
    with cpu_autocast():
        # Medusa: head i at position p predicts x_{p+2+i} ~ teacher[p+1+i].
        pos = torch.randint(0, t - 1 - cfg.medusa_heads, (cfg.medusa_positions,), generator=gen)
        head_feats = students.medusa(feats[:, pos])  # (H, B, P, C)
        medusa_loss = torch.zeros(())
        for i in range(cfg.medusa_heads):
            logits = F.linear(head_feats[i], lm_head)
            target = teacher[:, pos + 1 + i]
            medusa_loss = medusa_loss + 0.8**i * soft_ce(logits, target)
            stats[f"medusa{i}"] = agreement(logits, target)
        # EAGLE: (f_t, e(x_{t+1})) -> f_{t+1}; token loss through the frozen LM head.
        noisy = feats[:, :-1] + cfg.eagle_noise * torch.randn(feats[:, :-1].shape, generator=gen)
        pred = students.eagle(noisy, F.embedding(x[:, 1:], embed))  # (B, T-1, C)
        eagle_logits = F.linear(pred, lm_head)
        eagle_loss = F.smooth_l1_loss(pred.float(), feats[:, 1:]) + cfg.eagle_token_weight * soft_ce(
            eagle_logits, teacher[:, 1:])
        stats["eagle"] = agreement(eagle_logits, teacher[:, 1:])
        # Draft model: match the base's next-token distribution.
        draft_logits = students.draft(x).logits
        draft_loss = soft_ce(draft_logits, teacher)
        stats["draft"] = agreement(draft_logits, teacher)
    stats.update(medusa_loss=medusa_loss.item(), eagle_loss=eagle_loss.item(), draft_loss=draft_loss.item())
    return medusa_loss + eagle_loss + draft_loss, stats


def lr_at(step: int, cfg: DrafterTrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return 0.1 * cfg.lr + 0.45 * cfg.lr * (1 + math.cos(math.pi * progress))


def train(cfg: DrafterTrainConfig, model_dir: Path, workdir: Path, base_workdir: Path) -> dict:
    torch.set_num_threads(cfg.threads)
    workdir.mkdir(parents=True, exist_ok=True)
    base = load_model(model_dir, dtype=torch.bfloat16)
    for p in base.parameters():
        p.requires_grad_(False)
    ids, _, _ = prepare_data(base_workdir, base.config.vocab_size, TrainConfig().seed)
    train_stream, _ = split(ids)
    torch.manual_seed(cfg.seed)
    students = Students(base.config, cfg)
    opt = torch.optim.AdamW(students.parameters(), lr=cfg.lr, betas=(0.9, 0.95), weight_decay=0.0)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, history = load_checkpoint(workdir, students, opt, gen)
    window = TrainConfig(batch_size=cfg.batch_size, seq_len=cfg.seq_len)
    t0, done = time.time(), 0
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss, stats = losses(students, base, batch(train_stream, window, gen), cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(students.parameters(), 1.0)
        opt.step()
        step, done = step + 1, done + 1
        if step % 20 == 0 or step == cfg.steps:
            per_step = (time.time() - t0) / done
            shown = " ".join(f"{k} {v:.3f}" for k, v in stats.items())
            print(f"step {step}/{cfg.steps} {shown} eta {(cfg.steps - step) * per_step / 60:.1f} min",
                  flush=True)
        if step % cfg.ckpt_every == 0 or step == cfg.steps:
            history.append({"step": step, **{k: round(v, 4) for k, v in stats.items()}})
            save_checkpoint(workdir, students, opt, gen, step, history)
    save_drafter(students.medusa, "medusa", model_dir / "medusa")
    save_drafter(students.eagle, "eagle", model_dir / "eagle")
    save_model(students.draft, model_dir / "draft")
    summary = {"train_config": asdict(cfg), "history": history,
               "parameters": {name: sum(p.numel() for p in getattr(students, name).parameters())
                              for name in ("medusa", "eagle", "draft")}}
    (model_dir / "drafters.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    defaults = DrafterTrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--threads", type=int, default=defaults.threads)
    p.add_argument("--ckpt-every", type=int, default=defaults.ckpt_every)
    p.add_argument("--model", type=Path, default=BUNDLED_MODEL_DIR)
    p.add_argument("--workdir", type=Path, default=Path("runs/drafters"))
    p.add_argument("--base-workdir", type=Path, default=Path("runs/base"),
                   help="where the base training cached its token stream")
    args = p.parse_args(argv)
    cfg = DrafterTrainConfig(steps=args.steps, batch_size=args.batch_size, threads=args.threads,
                             ckpt_every=args.ckpt_every)
    summary = train(cfg, args.model, args.workdir, args.base_workdir)
    print(json.dumps(summary["parameters"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
