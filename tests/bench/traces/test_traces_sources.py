"""The committed prompt set: public sources only, none of the held-out judging sets,
every category of issue 41, each item in the recorder's shape."""

from __future__ import annotations

import json
from collections import Counter

from bench.traces.record import PROMPTS
from bench.traces.sources import CATEGORIES, SOURCES

HELD_OUT = ("spec-bench", "specdecode", "mt-bench", "mt_bench", "wmt", "cnn", "dailymail",
            "natural_questions", "natural-questions", "gsm8k", "sharegpt", "instructcoder")


def test_prompt_file_covers_every_category_from_public_sources() -> None:
    items = [json.loads(line) for line in PROMPTS.read_text().splitlines()]
    assert len({i["id"] for i in items}) == len(items)
    counts = Counter(i["category"] for i in items)
    assert set(counts) == set(CATEGORIES) and min(counts.values()) >= 20
    for item in items:
        assert item["source"] in SOURCES and item["id"].startswith(item["source"] + ":")
        assert [m["role"] for m in item["messages"]] == ["user"]
        assert item["messages"][0]["content"].strip()


def test_no_source_is_a_held_out_set() -> None:
    for name, source in SOURCES.items():
        text = f"{name} {source.repo} {source.path}".lower()
        assert not any(word in text for word in HELD_OUT), name
