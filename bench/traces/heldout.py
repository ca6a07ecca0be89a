"""Build bench/traces/data/heldout/prompts.jsonl: prompts from the issue-41 judging sets,
for evaluation only (never trained, tuned or ruled on).

    python -m bench.traces.heldout --clones DIR [--per-category 10] [--edits 40] [--seed 41]

DIR holds git clones named `owner+name/repo` (as for bench.traces.sources); each file is
read from its pinned commit with `git show`. Drawn: `per_category` of Spec-Bench's
questions in each of its six task families (its 80 MT-bench questions, eight
subcategories of ten, are one family, `mt_bench`; a question's first turn only: the
recorder sends one user message), and `edits` of InstructCoder's EditEval code edits
(instruction, blank line, the code to edit: the layout of the training set's code edits).
Per family `random.Random("<seed>:heldout:<family>")`, no length filter (the longest
question is 6,847 characters, within SmolLM2's context). An item that shares a run of
`RUN` words with a training prompt (bench/traces/data/prompts.jsonl) is left out before
the draw: some EditEval code edits start from a HumanEval function whose prompt is in the
training set. Provenance and licences: docs/TRACES.md, "Held-out sets".
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path

from bench.traces.sources import PROMPTS, Source, rebuild_hint, write_prompts

OUT = Path(__file__).parent / "data" / "heldout"
SOURCES = {
    "spec-bench": Source("hemingkx/Spec-Bench", "fd2c1cd7d2201ef71db4c5f4e455008f017967bf",
                         "data/spec_bench/question.jsonl",
                         "Apache-2.0 (questions: MT-bench Apache-2.0, WMT14, CNN/DailyMail, "
                         "Natural Questions, GSM8K; each its own)"),
    "instructcoder-editeval": Source("qishenghu/InstructCoder",
                                     "1e7befb4700405e74c2cf1a21b761dd36dcc8735",
                                     "edit_eval/edit_eval.jsonl", "MIT"),
}
RUN = 12  # words; shorter runs match stock phrases ("translate german to english")
MT_BENCH = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem",
            "humanities")


def word_runs(text: str) -> set[str]:
    """Every run of `RUN` consecutive words (lower-cased, punctuation dropped)."""
    words = re.findall(r"\w+", text.lower())
    return {" ".join(words[i:i + RUN]) for i in range(len(words) - RUN + 1)}


def prompt_texts(path: Path) -> Iterable[str]:
    for line in path.read_text().splitlines():
        yield from (m["content"] for m in json.loads(line)["messages"])


def spec_bench(clones: Path) -> Iterator[tuple[str, str, str, str]]:
    """(family, source, key, text): the first turn of every question."""
    for line in SOURCES["spec-bench"].text(clones).splitlines():
        row = json.loads(line)
        family = "mt_bench" if row["category"] in MT_BENCH else row["category"]
        yield family, "spec-bench", str(row["question_id"]), row["turns"][0]


def edit_eval(clones: Path) -> Iterator[tuple[str, str, str, str]]:
    """EditEval rows that give code to edit: instruction, blank line, the code."""
    for line in SOURCES["instructcoder-editeval"].text(clones).splitlines():
        row = json.loads(line)
        if row["input"].strip():
            key = row["task_id"].removeprefix("EditEval/")
            yield ("code_edit", "instructcoder-editeval", key,
                   f"{row['instruction'].strip()}\n\n{row['input']}")


def draw(clones: Path, per_category: int, edits: int, seed: int,
         training: Path = PROMPTS) -> list[dict]:
    seen = set().union(*map(word_runs, prompt_texts(training)))
    by_family: dict[str, list[tuple[str, str, str]]] = {}
    for family, source, key, text in [*spec_bench(clones), *edit_eval(clones)]:
        if word_runs(text) & seen:
            continue
        by_family.setdefault(family, []).append((source, key, text))
    items = []
    for family, pool in by_family.items():
        count = edits if family == "code_edit" else per_category
        rng = random.Random(f"{seed}:heldout:{family}")
        for source, key, text in rng.sample(pool, min(count, len(pool))):
            items.append({"id": f"{source}:{key}", "source": source, "category": family,
                          "messages": [{"role": "user", "content": text}]})
    return items


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clones", type=Path, required=True)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--per-category", type=int, default=10)
    parser.add_argument("--edits", type=int, default=40)
    parser.add_argument("--seed", type=int, default=41)
    args = parser.parse_args(argv)
    if not PROMPTS.exists():  # the draw leaves out what overlaps the training prompts
        print(f"{rebuild_hint(PROMPTS)} The held-out draw needs it first.", file=sys.stderr)
        return 2
    write_prompts(draw(args.clones, args.per_category, args.edits, args.seed), args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
