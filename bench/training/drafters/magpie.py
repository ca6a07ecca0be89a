"""Self-distillation data whose prompts the target writes too (Magpie).

    python -m bench.training.drafters.magpie --out runs/smollm2-magpie [--queries 2400]
        [--url http://127.0.0.1:PORT] [--concurrency 32] [--max-new 160] [--part I/N]

Why: the drafters learnt from `distill_data`'s templated prompts accept 2.3-2.75 tokens a
step on held-out prompts of those templates and 1.5-1.9 on the benchmark's (EAGLE k 3,
docs/results/2026-12-05-drafters.md): they learnt the templates' answers, not the model.
Magpie (arXiv 2406.08464): an instruction-tuned model given its chat template up to the
start of a user turn writes a user query from its own distribution; sampled many times,
that is a varied prompt set nobody wrote, and the target's answers to it are what the
target says to prompts like them.

Queries (`queries.jsonl`, drawn once; seeds fixed, so a rerun draws the same, and
`--draw-set 1` another set for a second folder): the
template's system turn, then `<|im_start|>user\\n` and, for a code query, one of
`CODE_OPENERS`, sampled at T 1.0 / top-p 0.95 up to 64 tokens. A system turn that names
the task steers the draw (`STEERING`). Kept: queries that ended by themselves, of at
least 4 words, seen once, none a benchmark prompt (`distill_data.bench_prompt_texts`).
Answers: each query as the only user message under the model's chat template (the
engine's `encode_chat`, as the benchmark encodes its prompts), every second one greedy
and the others at T 0.8, up to `--max-new` tokens; written as `distill_data`'s shards
(`magpie-NNNNN.jsonl`, `magpie1-NNNNN.jsonl` for draw set 1 ..., SHARD_ROWS rows of
{id, task, temperature, prompt_ids, response_ids, finish}; atomically; a restart skips
the shards present).

Sampled answers carry no seed, so a rerun samples them anew: vLLM CPU 0.32 fails a
seeded request whose prefill it chunks (`RuntimeError: CPU Generator does not use
offset`, `gpu_model_runner._bookkeeping_sync`), and its engine with it (every later
request a 500); a shard with a failed request is left for the next run.

Server: any OpenAI-compatible `/v1/completions` that takes token-id prompts and hands
back the answer's ids (vLLM's `return_token_ids`). Without --url, vLLM CPU is started on
the model (the project's vLLM virtualenv, both cores) and stopped at the end: batched,
it writes ~115 tokens/s here against ~30 for `distill_data`'s loop on the two cores.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import subprocess
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import httpx

TASK_SHARES = (("chat", 0.5), ("code", 0.35), ("structured", 0.15))
_SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"  # the template's
STEERING = {
    "chat": _SYSTEM,
    "code": _SYSTEM + ". Users ask you to write, explain, review and fix code: Python, "
                      "JavaScript, SQL, shell scripts.",
    "structured": _SYSTEM + ". Users ask you to answer with structured data: JSON objects, "
                            "JSON arrays, YAML, CSV tables.",
}
CODE_OPENERS = ("", "", "Write a Python", "How do I", "Can you explain", "Fix", "In JavaScript,",
                "Write a SQL", "Write a bash", "What is the difference between", "Why does my",
                "Write a function", "How can I use")
QUERY_MAX_TOKENS = 64
MIN_QUERY_WORDS = 4
ANSWER_TEMPERATURES = (0.0, 0.8)
SHARD_ROWS = 12
SEED = 20261205
DRAW_SET_SPAN = 1_000_000  # draw seeds a draw set owns


@dataclass(frozen=True)
class Query:
    id: int
    task: str
    text: str


def shard_stem(draw_set: int, i: int) -> str:
    """`magpie-NNNNN` (draw set 0), `magpie1-NNNNN`...: the trainer caches a shard's features
    by its name, so two folders' shards must not share one."""
    return f"magpie{draw_set or ''}-{i:05d}"


def query_prefix(task: str, opener: str) -> str:
    """The chat template up to the user turn's first words (SmolLM2's ChatML)."""
    return f"<|im_start|>system\n{STEERING[task]}<|im_end|>\n<|im_start|>user\n{opener}"


def draw_plan(n: int, draw_set: int = 0) -> list[tuple[int, str, str]]:
    """(seed, task, opener) for n draws, tasks in their shares, in a fixed order; another
    `draw_set` (a second data folder's) draws other queries with seeds of its own."""
    rng = random.Random(SEED + draw_set)
    tasks = [task for task, share in TASK_SHARES for _ in range(round(n * share))]
    rng.shuffle(tasks)
    base = SEED + draw_set * DRAW_SET_SPAN
    return [(base + i, task, rng.choice(CODE_OPENERS) if task == "code" else "")
            for i, task in enumerate(tasks)]


def keep(text: str, finish: str, seen: set[str], excluded: set[str]) -> str | None:
    """The query as kept, or None: cut off, too short, a repeat or a benchmark prompt."""
    text = text.strip()
    if finish != "stop" or len(text.split()) < MIN_QUERY_WORDS or "<|im" in text:
        return None
    key = " ".join(text.lower().split())
    if key in seen or text in excluded:
        return None
    seen.add(key)
    return text


async def _complete(client: httpx.AsyncClient, url: str, model: str, prompt: str | list[int],
                    max_tokens: int, temperature: float, seed: int | None) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens,
            "temperature": temperature, "top_p": 0.95 if temperature else 1.0,
            "stop": ["<|im_end|>"], "return_token_ids": True}
    if seed is not None:
        body["seed"] = seed
    reply = await client.post(f"{url}/v1/completions", json=body)
    reply.raise_for_status()
    choice = reply.json()["choices"][0]
    return {"text": choice.get("text") or "", "finish": choice.get("finish_reason") or "",
            "token_ids": list(choice.get("token_ids") or [])}


async def _bounded(jobs: Iterable, run, concurrency: int) -> list:
    gate = asyncio.Semaphore(concurrency)

    async def one(job):
        async with gate:
            return await run(job)

    return await asyncio.gather(*(one(job) for job in jobs))


async def draw_queries(client: httpx.AsyncClient, url: str, model: str, n: int,
                       concurrency: int, excluded: set[str], draw_set: int = 0) -> list[Query]:
    plan = draw_plan(n, draw_set)

    async def run(job: tuple[int, str, str]) -> dict:
        seed, task, opener = job
        return await _complete(client, url, model, query_prefix(task, opener),
                               QUERY_MAX_TOKENS, 1.0, seed)

    replies = await _bounded(plan, run, concurrency)
    seen: set[str] = set()
    queries: list[Query] = []
    for (_, task, opener), reply in zip(plan, replies, strict=True):
        text = keep(opener + reply["text"], reply["finish"], seen, excluded)
        if text is not None:
            queries.append(Query(len(queries), task, text))
    return queries


def answer_row(query: Query, prompt_ids: list[int], reply: dict, eos_id: int) -> dict:
    """A shard row in `distill_data`'s format: a stopped answer ends with its stop token."""
    response = reply["token_ids"]
    finish = "stop" if reply["finish"] == "stop" else "length"
    if finish == "stop" and (not response or response[-1] != eos_id):
        response = [*response, eos_id]
    return {"id": query.id, "task": query.task,
            "temperature": ANSWER_TEMPERATURES[query.id % len(ANSWER_TEMPERATURES)],
            "prompt_ids": prompt_ids, "response_ids": response, "finish": finish}


async def answer_shards(client: httpx.AsyncClient, url: str, model: str, queries: list[Query],
                        encode, eos_id: int, out: Path, max_new: int, concurrency: int,
                        part: tuple[int, int] = (0, 1), draw_set: int = 0) -> int:
    """Write the missing shards; returns how many were written."""
    shards = [queries[s: s + SHARD_ROWS] for s in range(0, len(queries), SHARD_ROWS)]
    todo = [i for i in range(len(shards)) if i % part[1] == part[0]
            and not (out / f"{shard_stem(draw_set, i)}.jsonl").exists()]

    async def shard(i: int) -> bool:
        prompts = [encode(q.text) for q in shards[i]]
        try:  # no seed: see the module's docstring
            replies = await asyncio.gather(*(
                _complete(client, url, model, ids, max_new,
                          ANSWER_TEMPERATURES[q.id % len(ANSWER_TEMPERATURES)], None)
                for q, ids in zip(shards[i], prompts, strict=True)))
        except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
            print(f"shard {i} failed, left for a rerun: {exc!r}", flush=True)
            return False
        rows = [answer_row(q, ids, r, eos_id)
                for q, ids, r in zip(shards[i], prompts, replies, strict=True)]
        partial = out / f"{shard_stem(draw_set, i)}.partial"
        partial.write_text("".join(json.dumps(row) + "\n" for row in rows))
        os.replace(partial, out / f"{shard_stem(draw_set, i)}.jsonl")
        print(f"shard {i}: {sum(len(r['response_ids']) for r in rows)} tokens", flush=True)
        return True

    return sum(await _bounded(todo, shard, max(1, concurrency // SHARD_ROWS)))


async def run(out: Path, model_dir: Path, url: str, model: str, n: int, max_new: int,
              concurrency: int, part: tuple[int, int], draw_set: int = 0) -> None:
    from bench.training.drafters.distill_data import bench_prompt_texts
    from workers.embedded.tokenizer import TextTokenizer

    out.mkdir(parents=True, exist_ok=True)
    tokenizer = TextTokenizer(model_dir / "tokenizer.json")
    queries_file = out / "queries.jsonl"
    async with httpx.AsyncClient(timeout=httpx.Timeout(600.0)) as client:
        if not queries_file.exists():
            queries = await draw_queries(client, url, model, n, concurrency,
                                         bench_prompt_texts(), draw_set)
            queries_file.with_suffix(".partial").write_text(
                "".join(json.dumps(q.__dict__) + "\n" for q in queries))
            os.replace(queries_file.with_suffix(".partial"), queries_file)
            print(f"{len(queries)} queries kept of {n} drawn", flush=True)
        queries = [Query(**json.loads(line)) for line in queries_file.read_text().splitlines()]
        written = await answer_shards(
            client, url, model, queries,
            lambda text: tokenizer.encode_chat([{"role": "user", "content": text}]),
            tokenizer.eos_id, out, max_new, concurrency, part, draw_set)
    print(f"{written} shards written to {out}", flush=True)


def _start_vllm(model_dir: Path, work: Path):
    from bench.engine.compare import vllm_command
    from workers.fleet.vllm_cpu import SERVER_ENV, cpu_dtype
    from workers.fleet.vllm_env import ensure_vllm
    from workers.processes import free_port, wait_http

    port = free_port()
    argv = vllm_command(ensure_vllm(), model_dir, "plain", 0, None, port, cpu_dtype())
    argv += ["--max-num-seqs", "64"]
    log = work / "vllm.log"
    env = {**os.environ, **SERVER_ENV, "VLLM_CPU_KVCACHE_SPACE": "2"}
    proc = subprocess.Popen(argv, stdout=log.open("wb"), stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    wait_http(f"{url}/health", 300, proc, "vLLM", log)
    return proc, url


def main(argv: list[str] | None = None) -> int:
    from bench.training.drafters.distill_data import data_parser

    p = data_parser(__doc__)
    p.add_argument("--url", default=None, help="a running server (default: start vLLM CPU)")
    p.add_argument("--served-model", default=None, help="its model name (default: the folder's)")
    p.add_argument("--queries", type=int, default=2400, help="queries drawn (some are dropped)")
    p.add_argument("--max-new", type=int, default=160)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--part", default="0/1", help="I/N: only shards s with s %% N == I")
    p.add_argument("--draw-set", type=int, default=0,
                   help="another draw set draws other queries (a second data folder: 1)")
    args = p.parse_args(argv)
    if args.model is None:
        from workers.embedded.fetch_model import ensure_smollm2

        args.model = ensure_smollm2()
    index, count = (int(v) for v in args.part.split("/"))
    proc, url = None, args.url
    if url is None:
        args.out.mkdir(parents=True, exist_ok=True)
        proc, url = _start_vllm(args.model, args.out)
    try:
        from bench.engine.compare import MODEL

        asyncio.run(run(args.out, args.model, url.rstrip("/"), args.served_model or MODEL,
                        args.queries, args.max_new, args.concurrency, (index, count),
                        args.draw_set))
    finally:
        if proc is not None:
            from workers.processes import stop_group

            stop_group(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
