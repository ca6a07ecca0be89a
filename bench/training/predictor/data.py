"""The predictor's training rows: recorded traces joined with their prompts.

One row per prompt that has both an n-gram and an EAGLE trace: the request as the
gateway would parse it (`gateway.schemas.parse_request`, T 0, `max_tokens` as recorded),
its feature vector from the gateway's own classification path
(`gateway.classifier.classify.request_vector`), the source dataset (the CV group), and
per drafter family the request's mean accept length (tokens per verify step over its
steps, docs/TRACES.md). Held-out sets are refused by name (`HELD_OUT`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

from gateway.classifier.classify import request_vector
from gateway.schemas import parse_request

ROOT = Path(__file__).resolve().parents[3]
TRACES = ROOT / "bench" / "traces" / "data"
DEFAULT_TRACES = TRACES / "smollm2" / "traces.jsonl"
DEFAULT_PROMPTS = TRACES / "prompts.jsonl"
FAMILIES = ("ngram", "eagle")
# Never trained, tuned or ruled on (issue 41): the judged sets and what they draw from.
HELD_OUT = ("spec-bench", "specbench", "spec_bench", "specdecode", "mt-bench", "mtbench",
            "mt_bench", "wmt", "cnn", "dailymail", "daily_mail", "natural-questions",
            "natural_questions", "gsm8k", "sharegpt", "instructcoder", "heldout")
HELD_OUT_TOKENS = frozenset({"nq", "dm", "cnndm"})


@dataclass(frozen=True, slots=True)
class Row:
    id: str
    source: str
    group: str  # the source dataset: never in both a CV fold's train and test
    category: str
    task: str
    features: tuple[float, ...]
    accept_length: dict[str, float]  # per family: tokens per verify step


def is_held_out(source: str) -> bool:
    """Whether a source name is (or derives from) a held-out set."""
    lower = source.lower()
    return (any(name in lower for name in HELD_OUT)
            or not HELD_OUT_TOKENS.isdisjoint(re.split(r"[-_:/. ]", lower)))


def dataset_group(source: str) -> str:
    """`codealpaca-2k` and `codealpaca-new` are one dataset: one group."""
    return source.split("-")[0]


def load_rows(traces: Path = DEFAULT_TRACES, prompts: Path = DEFAULT_PROMPTS,
              allow_held_out: bool = False) -> list[Row]:
    by_id = {}
    for line in prompts.read_text().splitlines():
        if line.strip():
            item = json.loads(line)
            by_id[item["id"]] = item
    lengths: dict[str, dict[str, float]] = {}
    max_tokens: dict[str, int] = {}
    for line in traces.read_text().splitlines():
        if not line.strip():
            continue
        trace = json.loads(line)
        if trace["method"] in FAMILIES and trace["accept_lengths"]:
            steps = trace["accept_lengths"]
            lengths.setdefault(trace["id"], {})[trace["method"]] = sum(steps) / len(steps)
            max_tokens[trace["id"]] = trace.get("max_tokens", 64)
    rows = []
    for key in sorted(lengths):
        found = lengths[key]
        if len(found) < len(FAMILIES) or key not in by_id:
            continue
        item = by_id[key]
        if is_held_out(item["source"]) and not allow_held_out:
            raise ValueError(f"held-out source in training data: {item['source']}")
        request = parse_request({"model": "trace", "messages": item["messages"],
                                 "temperature": 0, "max_tokens": max_tokens[key]}, "chat")
        task, features = request_vector(request)
        rows.append(Row(key, item["source"], dataset_group(item["source"]),
                        item.get("category", ""), task, features, found))
    return rows
