"""The live bench's prompts: stated mixes, and texts no prior, drafter or classifier saw.

Classes are (task, temperature). Mixes are shares of requests, as a user would describe
their traffic (`MIXES`). Every class is measured on its own prompts; a mix's rate weighs
the classes' per-request means by its shares (bench/live/stats.py).

Held out, by construction (`excluded_texts`, `drafter_exclusion`), and checked by
tests/bench/live/test_bench_live_prompts.py:
- the prior: `measured.json` comes from `bench engine --prompts 2 --seed 0` (vLLM pools:
  `bench vllm --write-measured`, its own prompts at `VLLM_CALIBRATION_SEED`) and the
  batch costs from `bench batching --seed 0`; every text those benches draw at seeds
  `PRIOR_SEEDS` (`PRIOR_DRAWS` per task, more than any of them asks for) is left out;
- the classifier's labelled set (both splits) is left out;
- the drafters: SmolLM2's heads were trained on 240 documents of the bundled corpus
  (`smollm2_data.corpus_shards`, seed 0: whole standard-library files and docstrings) as
  well as on the self-distillation prompts (which leave out every workload text). Eight of
  the workload's 18 modules are among those files and four of its docstring paragraphs
  among those docstrings: the live workload draws from none of them (`drafter_exclusion`).
  The bundled tiny model was trained on the whole corpus (all of the standard library),
  so on `--model tiny` the drafter part does not hold;
- within a run, the warm-up and every (replicate, concurrency) draw distinct texts:
  nothing measured at one concurrency is replayed at another.
"""

from __future__ import annotations

import json
import random
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from bench.workload import TASKS, Exclusion, _stdlib_texts, modules, prompts

VLLM_CALIBRATION_SEED = 11  # bench vllm's prompts, and so its --write-measured
# bench engine --write-measured (seed 0), bench batching (0), old live (1), bench vllm
PRIOR_SEEDS = (0, 1, VLLM_CALIBRATION_SEED)
PRIOR_DRAWS = 64  # per task and seed; the prior's benches draw 2-8
DRAFTER_DOCS = 240  # MODEL_CARD.md of smollm2-135m-instruct: --corpus-docs 240


def class_name(task: str, temperature: float) -> str:
    return f"{task}/t{temperature:g}"


def parse_class(cls: str) -> tuple[str, float]:
    task, _, t = cls.partition("/t")
    return task, float(t)


# shares of requests; "questions about code" are the chat task at T 0, "JSON extraction"
# the extract task (values copied from the prompt) at T 0
MIXES: dict[str, dict[str, float]] = {
    "code assistant": {"code/t0": 0.4, "edit/t0": 0.3, "chat/t0": 0.3},
    "chat product": {"chat/t0.7": 0.7, "extract/t0": 0.3},
    "even": {c: 0.2 for c in ("code/t0", "edit/t0", "chat/t0", "chat/t0.7", "extract/t0")},
}
CLASSES = tuple(dict.fromkeys(c for shares in MIXES.values() for c in shares))

# `--prompts FILE`: public prompts nobody here wrote, held out from everything that trained
# or tuned (bench/traces/heldout.py builds such a file; docs/TRACES.md), one class per
# category at T 0. Copy-heavy: code edits, summaries, RAG (answers that copy their input).
HELD_OUT = "heldout:"
NO_COPY = ("mt_bench", "translation", "qa", "math_reasoning")
COPY_HEAVY = ("code_edit", "summarization", "rag")
HELD_OUT_MIXES: dict[str, dict[str, float]] = {
    "held-out even": {f"{HELD_OUT}{c}/t0": 1 / 7 for c in (*NO_COPY, *COPY_HEAVY)},
    "held-out copy 0.2": {f"{HELD_OUT}{c}/t0": 0.2 for c in (*NO_COPY, "code_edit")},
    "held-out no copy": {f"{HELD_OUT}{c}/t0": 0.25 for c in NO_COPY},
}
HELD_OUT_CLASSES = tuple(dict.fromkeys(c for m in HELD_OUT_MIXES.values() for c in m))
ALL_MIXES = {**MIXES, **HELD_OUT_MIXES}


def held_out_file(path: str) -> dict[str, list[list[dict]]]:
    """Category -> the messages of its prompts, in the file's order (JSONL rows with
    `category` and `messages`, as bench/traces/heldout.py writes them)."""
    by: dict[str, list[list[dict]]] = {}
    with open(path) as handle:
        for line in handle:
            if line.strip():
                row = json.loads(line)
                by.setdefault(row["category"], []).append(row["messages"])
    return by


def prior_texts() -> frozenset[str]:
    """Every user text the prior's benches can have drawn (seeds `PRIOR_SEEDS`)."""
    return frozenset(m["content"] for task in TASKS for seed in PRIOR_SEEDS
                     for p in prompts(task, PRIOR_DRAWS, seed) for m in p.messages)


def classifier_texts() -> frozenset[str]:
    from bench.training.classifier.data import build_dataset

    return frozenset(e.text for split in ("train", "test") for e in build_dataset(split))  # type: ignore[arg-type]


@lru_cache(maxsize=1)
def drafter_documents() -> tuple[tuple[str, str], ...]:
    """(kind, text) of the corpus documents SmolLM2's drafters were trained on: the
    selection `smollm2_data.corpus_shards` makes (kinds code, prose, structured, >= 200
    characters, the first of each kind by its shares), whole (the shard holds a window of a
    code document: the whole file counts). Takes ~20 s (it builds the corpus)."""
    from bench.training.drafters.corpus import build_corpus

    shares = {"code": 0.45, "prose": 0.35, "structured": 0.2}  # smollm2_data._SHARES
    pool = [d for d in build_corpus(0) if d.kind in shares and len(d.text) >= 200]
    quota = {kind: round(DRAFTER_DOCS * share) for kind, share in shares.items()}
    return tuple((d.kind, d.text) for kind in shares
                 for d in [d for d in pool if d.kind == kind][: quota[kind]])


@lru_cache(maxsize=1)
def drafter_exclusion() -> Exclusion:
    """The workload's modules whose file is a training document, and its docstring
    paragraphs and function sources that lie inside one."""
    docs = drafter_documents()
    root = Path(sysconfig.get_paths()["stdlib"])
    code = {text for kind, text in docs if kind == "code"}
    gone = frozenset(m for m in modules() if (root / m).exists() and (root / m).read_text(
        encoding="utf-8") in code)
    flat = [" ".join(text.split()) for _, text in docs]
    paragraphs, sources = _stdlib_texts(Exclusion(gone))
    inside = frozenset(" ".join(t.split()) for t in (*paragraphs, *sources)
                       if any(" ".join(t.split()) in d for d in flat))
    return Exclusion(gone, inside)


def text_of(body: dict) -> str:
    return "\n".join(m["content"] for m in body["messages"])


@dataclass(frozen=True, slots=True)
class Item:
    cls: str
    body: dict
    fold: int  # 0 or 1: the half of its class it belongs to (the held-out oracle)
    index: int  # position in its draw


def draw(model: str, classes: tuple[str, ...], per_class: int, seed: int, max_tokens: int,
         taken: set[str], exclusion: Exclusion | None,
         held_out: dict[str, list[list[dict]]] | None = None) -> list[Item]:
    """`per_class` prompts of each class, none of whose texts is in `taken` (which grows by
    what is drawn), in a seeded random order; folds alternate within a class. A held-out
    class draws from `held_out` (its category's prompts, seeded order)."""
    items: list[Item] = []
    for cls in classes:
        task, temperature = parse_class(cls)
        if task.startswith(HELD_OUT):
            kept = _held_out(task.removeprefix(HELD_OUT), held_out or {}, per_class, seed,
                             max_tokens, taken)
            items += [Item(cls, body, i % 2, 0) for i, body in enumerate(kept)]
            continue
        kept = []
        attempt = 0
        while len(kept) < per_class:
            attempt += 1
            if attempt > 20:
                raise ValueError(f"{cls}: fewer than {per_class} fresh prompts")
            for p in prompts(task, 8 * per_class * attempt, seed + 7919 * attempt, exclusion):
                text = "\n".join(m["content"] for m in p.messages)
                if text not in taken and len(kept) < per_class:
                    taken.add(text)
                    body = p.chat_body(model, max_tokens, temperature)
                    body["seed"] = seed + len(kept)
                    kept.append(body)
        items += [Item(cls, body, i % 2, 0) for i, body in enumerate(kept)]
    random.Random(seed).shuffle(items)
    return [Item(it.cls, it.body, it.fold, i) for i, it in enumerate(items)]


def _held_out(category: str, held_out: dict[str, list[list[dict]]], per_class: int,
              seed: int, max_tokens: int, taken: set[str]) -> list[dict]:
    pool = list(held_out.get(category, []))
    random.Random(f"{seed}:{category}").shuffle(pool)
    kept: list[dict] = []
    for messages in pool:
        text = "\n".join(m["content"] for m in messages)
        if text in taken:
            continue
        taken.add(text)
        kept.append({"model": "", "messages": messages, "max_tokens": max_tokens,
                     "temperature": 0.0, "seed": seed + len(kept)})
        if len(kept) == per_class:
            return kept
    raise ValueError(f"{category}: fewer than {per_class} unused held-out prompts "
                     "(more replicates need a larger --prompts file)")


@dataclass(frozen=True, slots=True)
class Plan:
    warmup: list[Item]
    measured: dict[tuple[int, int], list[Item]]  # (replicate, concurrency) -> items


def plan(model: str, per_class: int, warmup: int, concurrency: tuple[int, ...],
         replicates: int, seed: int, max_tokens: int, held_out: bool = True,
         classes: tuple[str, ...] = CLASSES, prompts_file: str | None = None) -> Plan:
    """Every prompt of a run, all texts distinct, none seen by a prior or the classifier
    (and with `held_out`, none built from a drafter's training document). With
    `prompts_file` the held-out classes draw from it; the warm-up always comes from the
    workload's own classes (nothing held out is learned from before it is measured)."""
    taken = set(prior_texts() | classifier_texts())
    exclusion = drafter_exclusion() if held_out else None
    public = held_out_file(prompts_file) if prompts_file else None
    measured = {}
    for r in range(replicates):
        for c in concurrency:
            measured[(r, c)] = draw(model, classes, per_class, seed * 1000 + 100 * r + c,
                                    max_tokens, taken, exclusion, public)
    own = tuple(c for c in classes if c in CLASSES) or CLASSES
    per = -(-warmup // len(own)) if warmup else 0
    warm = draw(model, own, per, seed * 1000 + 999, max_tokens, taken, exclusion)[:warmup]
    return Plan(warm, measured)
