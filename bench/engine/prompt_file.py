"""Prompts from a JSONL file by category, for `specroute bench engine --prompt-file PATH`.

The held-out public prompts (bench/traces/data/heldout/prompts.jsonl, built by
`python -m bench.traces.heldout`: Spec-Bench's six task families and InstructCoder's
EditEval code edits) or the training prompts (bench/traces/data/prompts.jsonl) in the same
layout: one object per line with `category` and `messages`. Each category is one cell of
the bench; `n` prompts of it are drawn without replacement with
`random.Random("<seed>:<category>")`, the same ones for the same arguments. Held-out
prompts are for measuring only: nothing may be tuned on them.
"""

from __future__ import annotations

import json
import random
from collections import defaultdict
from pathlib import Path

from bench.workload import Prompt

# The issue-45 classes each category stands for (the report groups cells by them).
CLASSES = {
    "code_edit": "edit", "mt_bench": "chat", "qa": "chat", "translation": "chat",
    "math_reasoning": "chat", "summarization": "summary/rag", "rag": "summary/rag",
    # the training file's categories
    "chat": "chat", "code_generation": "code", "json": "structured", "math": "chat",
    "qa_extraction": "summary/rag",
}


def file_prompts(path: str | Path, n: int, seed: int,
                 categories: list[str] | None = None) -> dict[str, list[Prompt]]:
    """`n` prompts per category of the JSONL at `path` (every category, or `categories`)."""
    by_category: dict[str, list[Prompt]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        item = json.loads(line)
        by_category[item["category"]].append(
            Prompt(task=item["category"], messages=tuple(item["messages"])))
    wanted = categories or sorted(by_category)
    missing = [c for c in wanted if c not in by_category]
    if missing:
        raise ValueError(f"{path}: no prompts of categories {missing}")
    return {c: random.Random(f"{seed}:{c}").sample(by_category[c], min(n, len(by_category[c])))
            for c in wanted}
