"""SmolLM2 drafter training data: shards of token sequences -> cached target features.

A shard is a JSONL file of sequences (`prompt_ids` + `response_ids`): the self-distillation
shards of `distill_data`, or corpus documents rendered as ChatML assistant turns
(`corpus_shards`). `cached_features` runs the frozen target once per shard and keeps its
final-normed features (float16; what the engine hands drafters in `DecodeState.hidden`) and
its full-vocabulary argmax on disk, so a resumed run reuses them.

Legend: B sequences, T positions, C hidden size, V vocabulary.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from workers.embedded.model import LlamaForCausalLM

PAD = 2  # <|im_end|>: right padding, never attended to by real positions (causal)


@dataclass
class ShardFeatures:
    tokens: list[torch.Tensor]  # per sequence (T,) int64
    hidden: list[torch.Tensor]  # per sequence (T, C) float16, final-normed f_t
    argmax: list[torch.Tensor]  # per sequence (T,) int64, the target's argmax after f_t


def read_shard(path: Path) -> list[list[int]]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["prompt_ids"] + r["response_ids"] for r in rows]


_ASKS = {"code": "Show me some Python code.", "prose": "Explain a Python concept.",
         "structured": "Give me some JSON records."}
_SHARES = {"code": 0.45, "prose": 0.35, "structured": 0.2}


def corpus_shards(model_dir: Path, out: Path, docs: int, max_chars: int = 1000, per_shard: int = 12,
                  seed: int = 0) -> list[Path]:
    """Write `docs` corpus documents as ChatML (user ask, assistant text) shards, once."""
    from bench.training.drafters.corpus import build_corpus
    from workers.embedded.chat_template import apply_chat_template
    from workers.embedded.tokenizer import TextTokenizer

    n_shards = math.ceil(docs / per_shard)
    paths = [out / f"corpus-{i:05d}.jsonl" for i in range(n_shards)]
    if all(path.exists() for path in paths):
        return paths
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = TextTokenizer(model_dir / "tokenizer.json")
    template = (model_dir / "chat_template.jinja").read_text()
    rng = random.Random(seed)
    pool = [d for d in build_corpus(seed) if d.kind in _ASKS and len(d.text) >= 200]
    quota = {kind: round(docs * share) for kind, share in _SHARES.items()}
    picked = [d for kind in _SHARES for d in [d for d in pool if d.kind == kind][: quota[kind]]]
    rng.shuffle(picked)
    for i, path in enumerate(paths):
        rows = []
        for doc in picked[i * per_shard : (i + 1) * per_shard]:
            start = rng.randrange(max(1, len(doc.text) - max_chars)) if doc.kind == "code" else 0
            start = doc.text.rfind("\n", 0, start) + 1
            text = doc.text[start : start + max_chars]
            if doc.kind == "code":
                text = f"```python\n{text}\n```"
            ask = [{"role": "user", "content": _ASKS[doc.kind]}]
            prompt = tokenizer.encode(apply_chat_template(template, ask))
            response = tokenizer.encode(text) + [2]
            rows.append(json.dumps({"task": doc.kind, "prompt_ids": prompt,
                                    "response_ids": response}))
        path.write_text("\n".join(rows) + "\n")
    return paths


@torch.inference_mode()
def shard_features(base: LlamaForCausalLM, sequences: list[list[int]], max_len: int,
                   chunk: int = 4) -> ShardFeatures:
    """Run the target over right-padded sequences (causal, so padding never leaks back)."""
    out = ShardFeatures([], [], [])
    for s in range(0, len(sequences), chunk):
        group = [seq[:max_len] for seq in sequences[s : s + chunk]]
        longest = max(len(seq) for seq in group)
        x = torch.full((len(group), longest), PAD, dtype=torch.long)  # (B, T)
        for i, seq in enumerate(group):
            x[i, : len(seq)] = torch.tensor(seq)
        res = base(x)
        for i, seq in enumerate(group):
            n = len(seq)
            out.tokens.append(x[i, :n].clone())
            out.hidden.append(res.hidden[i, :n].to(torch.float16).clone())
            out.argmax.append(res.logits[i, :n].argmax(-1))
    return out


def cached_features(base: LlamaForCausalLM, shard: Path, cache_dir: Path,
                    max_len: int) -> ShardFeatures:
    """The shard's features from the cache, computed (and kept) where the cache has none or
    holds another shard's of the same name (its tokens differ)."""
    target = cache_dir / f"{shard.stem}.pt"
    sequences = read_shard(shard)
    if target.exists():
        feats = ShardFeatures(**torch.load(target))
        if [t.tolist() for t in feats.tokens] == [seq[:max_len] for seq in sequences]:
            return feats
        print(f"{target.name}: cached for another shard of that name, computed again", flush=True)
    feats = shard_features(base, sequences, max_len)
    torch.save(asdict(feats), cache_dir / f"{shard.stem}.tmp")
    (cache_dir / f"{shard.stem}.tmp").replace(target)
    return feats


def draft_vocabulary(sequences: list[torch.Tensor], size: int, vocab_size: int) -> torch.Tensor:
    """The `size` most frequent token ids (ties and unseen tokens: lower id first), sorted."""
    counts = torch.zeros(vocab_size, dtype=torch.float64)
    for seq in sequences:
        counts += torch.bincount(seq, minlength=vocab_size).double()
    rank = counts - torch.arange(vocab_size, dtype=torch.float64) * 1e-9  # stable tie-break
    return rank.topk(size).indices.sort().values


@dataclass
class Batch:
    tokens: torch.Tensor  # (B, T) int64
    hidden: torch.Tensor  # (B, T, C) float32
    argmax: torch.Tensor  # (B, T) int64
    valid: torch.Tensor  # (B, T) bool


def make_batch(data: ShardFeatures, index: list[int]) -> Batch:
    longest = max(len(data.tokens[i]) for i in index)
    b, c = len(index), data.hidden[0].shape[-1]
    out = Batch(tokens=torch.full((b, longest), PAD, dtype=torch.long),
                hidden=torch.zeros(b, longest, c),
                argmax=torch.zeros(b, longest, dtype=torch.long),
                valid=torch.zeros(b, longest, dtype=torch.bool))
    for row, i in enumerate(index):
        n = len(data.tokens[i])
        out.tokens[row, :n] = data.tokens[i]
        out.hidden[row, :n] = data.hidden[i].float()
        out.argmax[row, :n] = data.argmax[i]
        out.valid[row, :n] = True
    return out


def concat(parts: list[ShardFeatures]) -> ShardFeatures:
    return ShardFeatures([t for p in parts for t in p.tokens], [h for p in parts for h in p.hidden],
                         [a for p in parts for a in p.argmax])


SHARD_PATTERNS = ("shard-*.jsonl", "magpie*-*.jsonl")  # distill_data's, magpie's (any draw set)


def split_shards(folders: list[Path], holdout: list[int], max_shards: int = 10_000,
                 ) -> tuple[list[Path], list[Path]]:
    """(train, held-out) shards: the first `holdout[i]` shards of folder i are held out
    (one count: the same for every folder), so the held-out set has some of every data
    source; at most `max_shards` a folder."""
    counts = holdout * len(folders) if len(holdout) == 1 else holdout
    if len(counts) != len(folders):
        raise ValueError(f"{len(holdout)} held-out counts for {len(folders)} shard folders")
    train: list[Path] = []
    heldout: list[Path] = []
    for folder, count in zip(folders, counts, strict=True):
        found = sorted(p for pattern in SHARD_PATTERNS for p in folder.glob(pattern))
        found = found[:max_shards]
        heldout += found[:count]
        train += found[count:]
    return train, heldout


def prepare(base: LlamaForCausalLM, train_shards: list[Path], heldout_shards: list[Path],
            cache_dir: Path, vocab_file: Path, max_len: int, vocab_size: int,
            ) -> tuple[ShardFeatures, ShardFeatures, torch.Tensor]:
    """(train, held-out, draft vocabulary); the vocabulary is fixed at the first run."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    shards = heldout_shards + train_shards
    parts = []
    for i, shard in enumerate(shards):
        t0 = time.time()
        parts.append(cached_features(base, shard, cache_dir, max_len))
        positions = sum(len(t) for t in parts[-1].tokens)
        print(f"features {shard.name} ({i + 1}/{len(shards)}): {positions} positions, "
              f"{time.time() - t0:.1f}s", flush=True)
    heldout = concat(parts[:len(heldout_shards)])
    train = concat(parts[len(heldout_shards):])
    if not vocab_file.exists():
        torch.save(draft_vocabulary(train.tokens, vocab_size, base.config.vocab_size), vocab_file)
    return train, heldout, torch.load(vocab_file)


def coverage(data: ShardFeatures, vocab: torch.Tensor, vocab_size: int) -> float:
    """Share of the target's argmax tokens that lie in the draft vocabulary."""
    inside = torch.zeros(vocab_size, dtype=torch.bool)
    inside[vocab] = True
    all_argmax = torch.cat(data.argmax)
    return inside[all_argmax].float().mean().item()
