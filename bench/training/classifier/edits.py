"""Which code edits the classifier misses, on training and development prompts only.

    python -m bench.training.classifier.edits [--clones DIR] [--show N]

Two sets, neither of them a judging set (issue 41's held-out sets are refused by name):

- the training prompts (bench/traces/data/prompts.jsonl, `python -m bench.traces.sources`):
  every `code_edit` prompt not given `edit` is printed, with the task and reason it got;
  and the tasks given per category (prose must not become `edit` or `code`).
- a development set from Code Alpaca (with `--clones DIR`): its two files' rows with an
  input that are not in the training prompts, laid out as the training code edits are
  (instruction, blank line, input). The input is code when it shows a code sign
  (`CODE_LIKE`) on at least 24 characters; a row is **copy-heavy** when the dataset's own
  answer copies it: at least half of the answer's tokens sit in runs of 4 tokens found
  in the input (`copy_share`), **not copying** under a fifth. Printed: how many of each
  the classifier calls `edit` (recall on the first, false edits on the second), and the
  first N misses of each kind. The label is the answer's, not a person's: ports to
  another language copy names and strings (copy-heavy by it, not edits by the rule),
  and some of Code Alpaca's answers drop the code they were asked to fix.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

from bench.traces.sources import CODE_LIKE, PROMPTS, SOURCES
from bench.training.predictor.data import is_held_out
from gateway.classifier.classify import classify
from gateway.schemas import parse_request

_TOKEN = re.compile(r"\w+|[^\w\s]")
RUN = 4
COPY, NO_COPY = 0.5, 0.2
MIN_CODE_CHARS = 24


def copy_share(given: str, answer: str) -> float:
    """The share of `answer`'s tokens inside a run of `RUN` tokens that `given` holds."""
    source, out = _TOKEN.findall(given), _TOKEN.findall(answer)
    if len(out) < RUN:
        return 0.0
    runs = {tuple(source[i:i + RUN]) for i in range(len(source) - RUN + 1)}
    covered = [False] * len(out)
    for i in range(len(out) - RUN + 1):
        if tuple(out[i:i + RUN]) in runs:
            covered[i:i + RUN] = [True] * RUN
    return sum(covered) / len(out)


def task_of(text: str) -> tuple[str, str]:
    profile = classify(parse_request({"model": "m", "temperature": 0,
                                      "messages": [{"role": "user", "content": text}]}, "chat"))
    return profile.task, profile.reasons[0]


def training(prompts: Path, show: int) -> None:
    if is_held_out(str(prompts)):
        raise SystemExit(f"{prompts}: a held-out set; this diagnostic reads training prompts")
    table: Counter[tuple[str, str]] = Counter()
    for line in prompts.read_text().splitlines():
        item = json.loads(line)
        text = item["messages"][-1]["content"]
        task, reason = task_of(text)
        table[item["category"], task] += 1
        if item["category"] == "code_edit" and task != "edit" and show > 0:
            show -= 1
            print(f"-- {item['id']}: {task} ({reason[:80]})\n{text[:300]}")
    print("category: task given")
    for category in sorted({c for c, _ in table}):
        print(f"  {category}: " + ", ".join(f"{task} {n}" for (c, task), n in
                                            sorted(table.items()) if c == category))


def development(clones: Path, training_prompts: Path, show: int) -> None:
    taken = {json.loads(line)["messages"][-1]["content"].strip()
             for line in training_prompts.read_text().splitlines()}
    table: Counter[tuple[str, str]] = Counter()
    misses: dict[str, list[str]] = {"copy": [], "no copy": []}
    for name in ("codealpaca-2k", "codealpaca-new"):
        for row in json.loads(SOURCES[name].text(clones)):
            given = row["input"].strip()
            text = f"{row['instruction'].strip()}\n\n{given}"
            if len(given) < MIN_CODE_CHARS or not CODE_LIKE.search(given) or text in taken:
                continue
            share = copy_share(given, row["output"])
            kind = "copy" if share >= COPY else "no copy" if share < NO_COPY else "between"
            task, reason = task_of(text)
            table[kind, task] += 1
            if kind in misses and (task == "edit") == (kind == "no copy"):
                misses[kind].append(f"-- {share:.2f} {task} ({reason[:70]})\n{text[:240]}")
    for kind in ("copy", "no copy", "between"):
        total = sum(n for (k, _), n in table.items() if k == kind)
        print(f"Code Alpaca, code input, {kind}: edit {table[kind, 'edit']} of {total}")
    for kind, lines in misses.items():
        print(f"first {min(show, len(lines))} {'not edit' if kind == 'copy' else 'edit'}, {kind}:")
        print("\n".join(lines[:show]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, default=PROMPTS)
    parser.add_argument("--clones", type=Path, default=None,
                        help="git clones named owner+name/repo (Code Alpaca's development rows)")
    parser.add_argument("--show", type=int, default=20)
    args = parser.parse_args(argv)
    training(args.prompts, args.show)
    if args.clones is not None:
        development(args.clones, args.prompts, args.show)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
