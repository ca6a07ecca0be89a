"""Train the bundled base model from scratch: corpus -> BPE tokenizer -> Llama decoder.

    python -m bench.training.drafters.train [--steps N] [--out DIR] [--workdir runs/base]

Resumable: a checkpoint (model, optimizer, step, RNG) is written to the workdir every
`--ckpt-every` steps and picked up on the next start. Progress lines report loss,
tokens/s and ETA. The final bf16 weights, `config.json`, `tokenizer.json` and a
`training.json` summary land in `--out` (default: the bundled model folder).
"""

from __future__ import annotations

import argparse
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from bench.training.drafters.bpe import train_tokenizer
from bench.training.drafters.corpus import build_corpus
from workers.embedded.chat_template import EOS
from workers.embedded.checkpoint import init_weights, save_model
from workers.embedded.engine import BUNDLED_MODEL_DIR
from workers.embedded.model import LlamaForCausalLM, ModelConfig


@dataclass
class TrainConfig:
    steps: int = 2000
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 2e-3
    min_lr: float = 2e-4
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    vocab_size: int = 4096
    seed: int = 0
    ckpt_every: int = 200
    threads: int = 2


def prepare_data(workdir: Path, vocab_size: int, seed: int) -> tuple[np.ndarray, np.ndarray, Path]:
    """Tokenize the corpus once; cache the token stream and the tokenizer in workdir."""
    tok_path, data_path = workdir / "tokenizer.json", workdir / "tokens.npz"
    if not (tok_path.exists() and data_path.exists()):
        docs = build_corpus(seed)
        tok = train_tokenizer((d.text for d in docs), vocab_size)
        tok.save(str(tok_path))
        ids, kinds = [], []
        kind_ids = {"code": 0, "prose": 1, "structured": 2, "chat": 3}
        for doc, enc in zip(docs, tok.encode_batch([d.text for d in docs]), strict=True):
            ids.extend(enc.ids + [EOS])
            kinds.extend([kind_ids[doc.kind]] * (len(enc.ids) + 1))
        np.savez(data_path, ids=np.array(ids, dtype=np.uint16), kinds=np.array(kinds, dtype=np.uint8))
    data = np.load(data_path)
    return data["ids"], data["kinds"], tok_path


def split(ids: np.ndarray, holdout: float = 0.01) -> tuple[torch.Tensor, torch.Tensor]:
    n_val = int(len(ids) * holdout)
    stream = torch.from_numpy(ids.astype(np.int64))
    return stream[n_val:], stream[:n_val]


def batch(stream: torch.Tensor, cfg: TrainConfig, gen: torch.Generator) -> torch.Tensor:
    starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch_size,), generator=gen)
    return torch.stack([stream[s : s + cfg.seq_len + 1] for s in starts.tolist()])  # (B, T+1)


def lr_at(step: int, cfg: TrainConfig) -> float:
    if step < cfg.warmup:
        return cfg.lr * (step + 1) / cfg.warmup
    progress = (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def native_bf16() -> bool:
    """Whether this CPU multiplies bf16 natively (AVX-512-BF16, AMX). Without it oneDNN
    emulates bf16 and a product is ~190x slower than float32 (a (638, 8192) x (8192,
    576) product: 9.3 s against 0.05 on an AVX2 core pair), so autocast must stay off."""
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        return False


def cpu_autocast() -> torch.autocast:
    """bf16 autocast where the CPU computes bf16 natively; float32 elsewhere."""
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=native_bf16())


def lm_loss(model: torch.nn.Module, xy: torch.Tensor) -> torch.Tensor:
    with cpu_autocast():
        logits = model(xy[:, :-1]).logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), xy[:, 1:].reshape(-1))


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: torch.Tensor, cfg: TrainConfig, batches: int = 8) -> float:
    model.eval()
    gen = torch.Generator().manual_seed(1234)
    losses = [lm_loss(model, batch(val, cfg, gen)).item() for _ in range(batches)]
    model.train()
    return sum(losses) / len(losses)


def load_checkpoint(workdir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
                    gen: torch.Generator) -> tuple[int, list[dict]]:
    """Restore module, optimizer and sampler state from `workdir/ckpt.pt`; (step, history)."""
    ckpt = workdir / "ckpt.pt"
    if not ckpt.exists():
        return 0, []
    state = torch.load(ckpt, weights_only=False)
    module.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    gen.set_state(state["gen"])
    print(f"resumed from step {state['step']}", flush=True)
    return state["step"], state["history"]


def save_checkpoint(workdir: Path, module: torch.nn.Module, opt: torch.optim.Optimizer,
                    gen: torch.Generator, step: int, history: list[dict]) -> None:
    """Write the checkpoint atomically (a crash mid-write keeps the previous one)."""
    torch.save({"model": module.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(),
                "step": step, "history": history}, workdir / "ckpt.tmp")
    (workdir / "ckpt.tmp").replace(workdir / "ckpt.pt")


def train(cfg: TrainConfig, model_cfg: ModelConfig, workdir: Path, out: Path) -> dict:
    torch.set_num_threads(cfg.threads)
    workdir.mkdir(parents=True, exist_ok=True)
    ids, _, tok_path = prepare_data(workdir, cfg.vocab_size, cfg.seed)
    train_stream, val_stream = split(ids)
    model_cfg.vocab_size = cfg.vocab_size
    torch.manual_seed(cfg.seed)
    model = LlamaForCausalLM(model_cfg)
    init_weights(model)
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95),
    )
    gen = torch.Generator().manual_seed(cfg.seed)
    step, history = load_checkpoint(workdir, model, opt, gen)
    model.train()
    t0, tokens_seen = time.time(), 0
    while step < cfg.steps:
        for group in opt.param_groups:
            group["lr"] = lr_at(step, cfg)
        loss = lm_loss(model, batch(train_stream, cfg, gen))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        tokens_seen += cfg.batch_size * cfg.seq_len
        if step % 20 == 0 or step == cfg.steps:
            rate = tokens_seen / (time.time() - t0)
            eta = (cfg.steps - step) * cfg.batch_size * cfg.seq_len / rate
            print(f"step {step}/{cfg.steps} loss {loss.item():.3f} lr {lr_at(step, cfg):.2e} "
                  f"{rate:.0f} tok/s eta {eta / 60:.1f} min", flush=True)
        if step % cfg.ckpt_every == 0 or step == cfg.steps:
            val = evaluate(model, val_stream, cfg)
            history.append({"step": step, "train_loss": round(loss.item(), 4), "val_loss": round(val, 4)})
            print(f"step {step} val_loss {val:.3f}", flush=True)
            save_checkpoint(workdir, model, opt, gen, step, history)
    save_model(model, out)
    (out / "tokenizer.json").write_text(tok_path.read_text())
    summary = {
        "parameters": model.num_parameters(),
        "train_tokens": cfg.steps * cfg.batch_size * cfg.seq_len,
        "corpus_tokens": int(len(ids)),
        "train_config": asdict(cfg),
        "history": history,
    }
    (out / "training.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def main(argv: list[str] | None = None) -> int:
    defaults = TrainConfig()
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=defaults.steps)
    p.add_argument("--batch-size", type=int, default=defaults.batch_size)
    p.add_argument("--seq-len", type=int, default=defaults.seq_len)
    p.add_argument("--vocab-size", type=int, default=defaults.vocab_size)
    p.add_argument("--threads", type=int, default=defaults.threads)
    p.add_argument("--ckpt-every", type=int, default=defaults.ckpt_every)
    p.add_argument("--hidden-size", type=int, default=ModelConfig.hidden_size)
    p.add_argument("--layers", type=int, default=ModelConfig.num_hidden_layers)
    p.add_argument("--workdir", type=Path, default=Path("runs/base"))
    p.add_argument("--out", type=Path, default=BUNDLED_MODEL_DIR)
    args = p.parse_args(argv)
    cfg = TrainConfig(steps=args.steps, batch_size=args.batch_size, seq_len=args.seq_len,
                      vocab_size=args.vocab_size, threads=args.threads, ckpt_every=args.ckpt_every)
    hidden = args.hidden_size
    model_cfg = ModelConfig(hidden_size=hidden, intermediate_size=int(hidden * 2.75) // 16 * 16,
                            num_hidden_layers=args.layers, num_attention_heads=max(1, hidden // 32),
                            num_key_value_heads=max(1, hidden // 64))
    summary = train(cfg, model_cfg, args.workdir, args.out)
    print(json.dumps({k: v for k, v in summary.items() if k != "history"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
