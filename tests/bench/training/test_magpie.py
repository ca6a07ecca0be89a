"""Magpie data: queries the target writes are kept only when whole, new and not a
benchmark prompt; answers land as `distill_data`'s shards (a stopped answer ends with its
stop token), and a restart writes only the shards missing."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path

import httpx

from bench.training.drafters import magpie
from bench.training.drafters.smollm2_data import read_shard

EOS = 2


class FakeCompletions:
    """vLLM's `/v1/completions` answer shape (`return_token_ids`): a query prompt (text)
    gets a text; an answer prompt (token ids) gets ids, stopped or cut by max_tokens."""

    def __init__(self, queries: list[tuple[str, str]]) -> None:
        self.queries = queries  # (text, finish) in the order asked
        self.bodies: list[dict] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        self.bodies.append(body)
        assert request.url.path == "/v1/completions" and body["return_token_ids"]
        if isinstance(body["prompt"], str):
            text, finish = self.queries[(body["seed"] - magpie.SEED) % len(self.queries)]
            choice = {"text": text, "finish_reason": finish, "token_ids": [7] * 5}
        else:
            n = len(body["prompt"]) % 5 + 1  # stops after n tokens, or is cut at max_tokens
            ids = list(range(10, 10 + min(n, body["max_tokens"])))
            stopped = n <= body["max_tokens"]
            choice = {"text": "x", "finish_reason": "stop" if stopped else "length",
                      "token_ids": ids + ([EOS] if stopped and n % 2 else [])}
        return httpx.Response(200, json={"choices": [choice]})


def _client(fake: FakeCompletions) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.MockTransport(fake))


def test_the_plan_draws_every_task_in_its_share_and_code_openers_only_for_code() -> None:
    plan = magpie.draw_plan(400)
    counts = Counter(task for _, task, _ in plan)
    assert counts == {"chat": 200, "code": 140, "structured": 60}
    assert len({seed for seed, _, _ in plan}) == 400
    assert all(opener == "" for _, task, opener in plan if task != "code")
    assert {opener for _, task, opener in plan if task == "code"} - {""}
    assert magpie.draw_plan(400) == plan  # a rerun draws the same
    other = magpie.draw_plan(400, draw_set=1)  # a second folder draws other queries
    assert not {s for s, _, _ in other} & {s for s, _, _ in plan}
    assert min(s for s, _, _ in other) > 0


def test_queries_are_kept_only_when_whole_new_long_enough_and_not_benchmark_prompts(
        monkeypatch) -> None:
    monkeypatch.setattr(magpie, "CODE_OPENERS", ("",))
    fake = FakeCompletions([
        ("How do I sort a list of tuples by the second item?", "stop"),
        ("How do I sort a list  of tuples by the SECOND item?", "stop"),  # a repeat
        ("Tell me everything about the history of", "length"),  # cut off
        ("Hello there", "stop"),  # too short
        ("Tell me about median_grouped.", "stop"),  # a benchmark prompt
        ("What should I pack for a week of hiking in Norway?", "stop"),
    ])

    async def draw():
        async with _client(fake) as client:
            return await magpie.draw_queries(client, "http://w", "m", 6, 3,
                                             {"Tell me about median_grouped."})

    queries = asyncio.run(draw())
    assert sorted(q.text for q in queries) == [
        "How do I sort a list of tuples by the second item?",
        "What should I pack for a week of hiking in Norway?"]
    assert [q.id for q in queries] == list(range(len(queries)))
    prompts = [b["prompt"] for b in fake.bodies]
    assert all(p.startswith("<|im_start|>system\nYou are a helpful AI assistant") and
               p.count("<|im_start|>user\n") == 1 for p in prompts)
    assert all(b["temperature"] == 1.0 and b["stop"] == ["<|im_end|>"] for b in fake.bodies)


def test_answers_are_shards_the_trainer_reads_and_a_restart_writes_only_the_missing(
        tmp_path: Path) -> None:
    queries = [magpie.Query(i, "chat" if i % 3 else "code", f"question number {i} here")
               for i in range(30)]  # 3 shards of up to 12
    fake = FakeCompletions([])

    def encode(text: str) -> list[int]:
        return [1] * (3 + int(text.split()[2]))

    async def answer(max_new: int) -> int:
        async with _client(fake) as client:
            return await magpie.answer_shards(client, "http://w", "m", queries, encode, EOS,
                                              tmp_path, max_new, 24)

    assert asyncio.run(answer(4)) == 3
    rows = [json.loads(line) for path in sorted(tmp_path.glob("magpie-*.jsonl"))
            for line in path.read_text().splitlines()]
    assert [r["id"] for r in rows] == list(range(30))
    for row, query in zip(rows, queries, strict=True):
        assert row["task"] == query.task and row["prompt_ids"] == encode(query.text)
        assert row["temperature"] == (0.0 if query.id % 2 == 0 else 0.8)
        if row["finish"] == "stop":
            assert row["response_ids"][-1] == EOS and row["response_ids"].count(EOS) == 1
        else:
            assert EOS not in row["response_ids"] and len(row["response_ids"]) == 4
    assert {r["finish"] for r in rows} == {"stop", "length"}
    assert {b["temperature"] for b in fake.bodies} == {0.0, 0.8}
    assert not any("seed" in b for b in fake.bodies)  # vLLM CPU dies on chunked seeded ones
    assert len(read_shard(tmp_path / "magpie-00000.jsonl")) == 12

    (tmp_path / "magpie-00001.jsonl").unlink()
    asked = len(fake.bodies)
    assert asyncio.run(answer(4)) == 1
    assert len(fake.bodies) - asked == 12 and (tmp_path / "magpie-00001.jsonl").exists()


def test_a_shard_whose_request_fails_is_left_for_the_next_run(tmp_path: Path) -> None:
    queries = [magpie.Query(i, "chat", f"question number {i} here") for i in range(24)]
    fake = FakeCompletions([])

    def failing(request: httpx.Request) -> httpx.Response:
        if json.loads(request.content)["prompt"] == [1] * 20:  # query 17, in shard 1
            return httpx.Response(500, text="Internal Server Error")
        return fake(request)

    async def answer() -> int:
        async with httpx.AsyncClient(transport=httpx.MockTransport(failing)) as client:
            return await magpie.answer_shards(client, "http://w", "m", queries,
                                              lambda t: [1] * (3 + int(t.split()[2])), EOS,
                                              tmp_path, 4, 24)

    assert asyncio.run(answer()) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["magpie-00000.jsonl"]
