"""Self-distillation data for SmolLM2 drafters: the target's own answers to a prompt set.

    python -m bench.training.drafters.distill_data --out runs/smollm2-distill \
        [--model DIR] [--limit N] [--batch 12] [--max-new 160]

Drafters trained on the target's outputs rather than on a generic corpus learn what the
target will actually say (Medusa-2 self-distillation, arXiv 2401.10774; EAGLE-3
arXiv 2503.01840 and HASS arXiv 2408.15766 train on target-generated data too).

Prompts: templates x topic lists over three tasks — code (Python / JavaScript / SQL /
shell functions, explanations, fixes), structured (extract fields to JSON, produce
YAML / CSV) and chat (questions, advice, summaries) — a few thousand, deterministic.
The held-out benchmark prompts (bench/workload.py) are drawn and excluded.
Each prompt is rendered with the model's ChatML template; half are answered greedily,
half at temperature 0.8, up to `--max-new` tokens, stopping at `<|im_end|>`.

Generation batches prompts of equal token length and equal temperature, so one shared
position range and plain causal attention serve the whole batch (model.py's forward takes
one `positions` row for all sequences). Output: one JSONL shard per batch,
`shard-NNNNN.jsonl`, each line {id, task, temperature, prompt_ids, response_ids, finish};
written atomically; a restart skips the shards present (batch plan and seeds are fixed,
so a resumed run produces what an uninterrupted one would).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workers.embedded.chat_template import apply_chat_template
from workers.embedded.checkpoint import load_model
from workers.embedded.model import LlamaForCausalLM
from workers.embedded.tokenizer import TextTokenizer

TEMPERATURES = (0.0, 0.8)
SEED = 20250214

_LANG_TASKS = {
    "Python": ["reverses the words in a sentence", "checks whether a string is a palindrome",
               "merges two sorted lists", "counts word frequencies in a text",
               "flattens a nested list", "computes the nth Fibonacci number",
               "removes duplicates from a list while keeping order",
               "validates an email address with a regular expression",
               "reads a CSV file and returns the rows as dictionaries",
               "finds the largest prime factor of a number", "groups items by a key",
               "converts a temperature from Celsius to Fahrenheit",
               "returns the most common element of a list", "chunks a list into pieces of size n",
               "parses a date string in ISO format", "computes the median of a list of numbers"],
    "JavaScript": ["debounces a function", "deep-clones an object", "capitalizes every word",
                   "sums the values of an array", "fetches JSON from a URL and logs it",
                   "shuffles an array in place", "checks if two strings are anagrams",
                   "formats a number as currency", "validates a phone number",
                   "removes falsy values from an array"],
    "SQL": ["finds the top 5 customers by total order amount",
            "counts orders per month in 2023", "lists employees earning more than their manager",
            "deletes duplicate rows from a users table", "finds products never ordered",
            "computes the average salary per department", "joins orders with customers",
            "returns the second highest salary"],
    "Bash": ["counts the lines in every .txt file of a folder", "backs up a directory to a tar.gz",
             "finds the 10 largest files under /var/log", "renames all .jpeg files to .jpg",
             "checks whether a website is reachable", "prints disk usage per user folder"],
}
_CODE_TEMPLATES = ["Write a {lang} function that {what}.", "In {lang}, how do I write code that {what}?",
                   "Give me a short {lang} snippet that {what}.",
                   "Write {lang} code that {what}, with a brief comment."]
_EXPLAIN = ["list comprehensions in Python", "Python decorators", "the difference between == and is "
            "in Python", "JavaScript promises", "async/await in JavaScript", "SQL LEFT JOIN",
            "database indexes", "recursion", "Big-O notation", "git rebase versus git merge",
            "the Python GIL", "closures in JavaScript", "REST APIs", "unit testing",
            "Python generators", "the shell pipe operator", "environment variables",
            "hash tables", "binary search", "regular expressions"]
_EXPLAIN_TEMPLATES = ["Explain {topic} with a short example.", "Can you explain {topic}?",
                      "How does {topic} work in practice?"]
_BUGS = [("Python", "def add(a, b):\n    return a - b"),
         ("Python", "for i in range(10)\n    print(i)"),
         ("Python", "def mean(xs):\n    return sum(xs) / len(x)"),
         ("Python", "names = ['a', 'b']\nprint(names[2])"),
         ("JavaScript", "function sq(x) { return x * x }\nconsole.log(sq('3' + 1))"),
         ("JavaScript", "const total = [1, 2, 3].reduce((a, b) => a + b)\nconsole.log(totl)"),
         ("SQL", "SELECT name, COUNT(*) FROM users;"),
         ("Bash", "for f in *.txt do echo $f; done")]
_FIX_TEMPLATES = ["Fix the bug in this {lang} code:\n```\n{code}\n```",
                  "Why does this {lang} code fail?\n```\n{code}\n```"]

_RECORDS = [
    "John Smith, 34, lives in Boston and works as a nurse. Email: john.smith@example.com.",
    "Order #4521 was placed on March 3 by Ana Lopez for 2 laptops, total $2,398, status shipped.",
    "The Hotel Aurora in Lisbon has 120 rooms, a rating of 4.5 and costs 140 euros per night.",
    "Meeting with the design team on Friday at 10am in room B12 to review the new logo.",
    "Product: wireless mouse, brand Logi, price 25.99, in stock: yes, color: black.",
    "Flight BA117 from London to New York departs at 08:20 and arrives at 11:05, gate 23.",
    "Dr. Priya Patel, cardiologist, phone 555-0134, available Monday to Thursday.",
    "The book Dune by Frank Herbert was published in 1965 and has 412 pages.",
    "Invoice 2024-118 from Acme Corp: 3 chairs at $45 each, 1 desk at $210, due April 30.",
    "Weather in Tokyo: 22 degrees, humidity 60%, light rain, wind 12 km/h from the east.",
    "Student Liam Chen, grade 10, scores: math 91, physics 85, history 78.",
    "Job posting: senior data engineer, remote, salary 120k-140k, skills Python, SQL, Spark.",
]
_EXTRACT_TEMPLATES = ["Extract the key fields from this text as JSON:\n{record}",
                      "Convert this to a JSON object:\n{record}",
                      "Turn this into YAML:\n{record}",
                      "Give the information below as a CSV row with a header line:\n{record}"]
_GENERATE_ITEMS = ["3 fictional users with name, age and country", "a shopping cart with 4 items",
                   "a configuration for a web server with host, port and logging level",
                   "5 books with title, author and year", "a recipe with ingredients and steps",
                   "an API error response with code and message", "4 cities with population",
                   "a weekly schedule with 3 events", "a product catalog entry for a phone",
                   "2 employees with id, name, role and salary"]
_GENERATE_TEMPLATES = ["Write JSON describing {item}.", "Produce YAML for {item}.",
                       "Create a CSV table of {item}.", "Output only a JSON array of {item}."]

_QUESTIONS = ["What is the capital of {place}?", "What is {place} famous for?",
              "What language is spoken in {place}?", "Give me three facts about {place}."]
_PLACES = ["France", "Japan", "Brazil", "Canada", "Egypt", "Norway", "India", "Kenya",
           "Australia", "Mexico", "Italy", "Peru"]
_SCIENCE = ["photosynthesis", "gravity", "black holes", "the water cycle", "vaccines",
            "climate change", "DNA", "volcanoes", "the immune system", "electricity",
            "the moon's phases", "inflation in economics", "compound interest", "sleep",
            "the Roman Empire", "the printing press"]
_SCIENCE_TEMPLATES = ["Explain {topic} in simple terms.", "What is {topic}?",
                      "Why is {topic} important?", "Summarize what we know about {topic}."]
_ADVICE = ["sleep better", "learn a new language", "stay focused while studying",
           "prepare for a job interview", "save money each month", "start running",
           "write a good cover letter", "manage stress at work", "make friends in a new city",
           "keep houseplants alive", "cook healthy meals on a budget", "learn to program"]
_ADVICE_TEMPLATES = ["How can I {goal}?", "Give me tips to {goal}.",
                     "What is the best way to {goal}?"]
_PASSAGES = [
    "The city council voted on Tuesday to expand the bike lane network by 40 kilometers over "
    "the next three years, citing rising cyclist numbers and fewer accidents on protected lanes.",
    "Researchers found that people who walked for 30 minutes a day reported better mood and "
    "sleep after six weeks, compared with a group that did not change their routine.",
    "The company reported a 12% rise in quarterly revenue, driven by cloud services, while its "
    "hardware sales fell for the third quarter in a row.",
    "A new library opened downtown with a maker space, a children's wing and a cafe; it will "
    "stay open until 10pm on weekdays to serve students and workers.",
    "Heavy rain caused flooding in several villages, and emergency teams evacuated 300 people; "
    "forecasters expect the weather to improve by the weekend.",
    "The museum's new exhibit shows 200 photographs of everyday life in the 1950s, donated by "
    "a local family who kept them in their attic for decades.",
]
_STYLES = ["", " Keep it short.", " Explain your answer.", " Use simple words.",
           " Include an example."]
_SUMMARY_TEMPLATES = ["Summarize this in one sentence:\n{text}", "What is the main point?\n{text}",
                      "Write a short headline for this:\n{text}"]


@dataclass(frozen=True)
class PromptItem:
    task: str  # code | structured | chat
    text: str


def build_prompts() -> list[PromptItem]:
    """Every template x topic x style combination, in a fixed order."""
    items = [PromptItem("code", t.format(lang=lang, what=what))
             for lang, whats in _LANG_TASKS.items() for what in whats for t in _CODE_TEMPLATES]
    items += [PromptItem("code", t.format(topic=topic))
              for topic in _EXPLAIN for t in _EXPLAIN_TEMPLATES]
    items += [PromptItem("code", t.format(lang=lang, code=code))
              for lang, code in _BUGS for t in _FIX_TEMPLATES]
    items += [PromptItem("structured", t.format(record=r))
              for r in _RECORDS for t in _EXTRACT_TEMPLATES]
    items += [PromptItem("structured", t.format(item=i))
              for i in _GENERATE_ITEMS for t in _GENERATE_TEMPLATES]
    items += [PromptItem("chat", t.format(place=p)) for p in _PLACES for t in _QUESTIONS]
    items += [PromptItem("chat", t.format(topic=s)) for s in _SCIENCE for t in _SCIENCE_TEMPLATES]
    items += [PromptItem("chat", t.format(goal=g)) for g in _ADVICE for t in _ADVICE_TEMPLATES]
    items += [PromptItem("chat", t.format(text=p)) for p in _PASSAGES for t in _SUMMARY_TEMPLATES]
    styled = [PromptItem(item.task, item.text + style) for style in _STYLES for item in items]
    held_out = bench_prompt_texts()
    return [item for item in styled if item.text not in held_out]


def bench_prompt_texts(draws: int = 3000, seeds: int = 3) -> set[str]:
    """User texts of the benchmark workload (many draws per task and seed: its template x
    name space is finite, so this covers it)."""
    from bench.workload import TASKS, prompts

    return {m["content"] for task in TASKS for seed in range(seeds)
            for p in prompts(task, draws, seed) for m in p.messages}


@dataclass(frozen=True)
class Job:
    id: int
    task: str
    temperature: float
    prompt_ids: tuple[int, ...]


def plan_batches(items: list[PromptItem], template: str, tokenizer: TextTokenizer,
                 batch_size: int) -> list[list[Job]]:
    """Alternate temperatures over prompts, group equal (length, temperature), cut into
    batches, and shuffle the batch order (fixed seed) so that every prefix of shards
    mixes tasks."""
    groups: dict[tuple[int, float], list[Job]] = {}
    for i, item in enumerate(items):
        text = apply_chat_template(template, [{"role": "user", "content": item.text}])
        ids = tuple(tokenizer.encode(text))
        temperature = TEMPERATURES[i % len(TEMPERATURES)]
        groups.setdefault((len(ids), temperature), []).append(Job(i, item.task, temperature, ids))
    batches = [jobs[s : s + batch_size] for _, jobs in sorted(groups.items())
               for s in range(0, len(jobs), batch_size)]
    random.Random(SEED).shuffle(batches)
    return batches


@torch.inference_mode()
def generate_batch(model: LlamaForCausalLM, jobs: list[Job], max_new: int, stop_ids: set[int],
                   seed: int) -> list[tuple[list[int], str]]:
    """Decode equal-length prompts together; returns (response ids, finish) per job. Rows
    that stopped keep decoding (their extra tokens are dropped) until all have stopped."""
    b, t = len(jobs), len(jobs[0].prompt_ids)
    temperature = jobs[0].temperature
    generator = torch.Generator().manual_seed(seed)
    cache = model.new_cache(batch_size=b, max_length=t + max_new)
    logits = model(torch.tensor([j.prompt_ids for j in jobs]), cache, last_only=True).logits[:, -1]
    cache.commit()
    out: list[list[int]] = [[] for _ in jobs]
    done = [False] * b
    for step in range(max_new):
        if temperature == 0:
            nxt = logits.argmax(-1)  # (B,)
        else:
            probs = torch.softmax(logits / temperature, -1)  # (B, V)
            nxt = torch.multinomial(probs, 1, generator=generator)[:, 0]
        for row, token in enumerate(nxt.tolist()):
            if not done[row]:
                out[row].append(token)
                done[row] = token in stop_ids
        if all(done) or step == max_new - 1:
            break
        logits = model(nxt[:, None], cache).logits[:, -1]  # (B, V)
        cache.commit()
    finish = ["stop" if d else "length" for d in done]
    return list(zip(out, finish, strict=True))


def _write_shard(path: Path, jobs: list[Job], results: list[tuple[list[int], str]]) -> None:
    partial = path.with_suffix(".partial")
    with open(partial, "w") as handle:
        for job, (response, finish) in zip(jobs, results, strict=True):
            handle.write(json.dumps({"id": job.id, "task": job.task,
                                     "temperature": job.temperature,
                                     "prompt_ids": list(job.prompt_ids),
                                     "response_ids": response, "finish": finish}) + "\n")
    os.replace(partial, path)


def run(out: Path, model_dir: Path, batch_size: int, max_new: int, limit: int | None,
        part: tuple[int, int] = (0, 1)) -> None:
    """Write the missing shards; with part = (i, n) only batches b with b % n == i, so n
    processes (one per core) share a run."""
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = TextTokenizer(model_dir / "tokenizer.json")
    template = (model_dir / "chat_template.jinja").read_text()
    items = build_prompts()
    batches = plan_batches(items, template, tokenizer, batch_size)
    if limit is not None:
        batches = batches[:limit]
    model = load_model(model_dir, dtype=torch.float32).fuse()  # the engine's decode path
    stop_ids = {model.config.eos_token_id}
    todo = [i for i in range(len(batches))
            if i % part[1] == part[0] and not (out / f"shard-{i:05d}.jsonl").exists()]
    print(f"{len(items)} prompts in {len(batches)} batches; {len(batches) - len(todo)} shards "
          f"present, {len(todo)} to go", flush=True)
    tokens, start = 0, time.perf_counter()
    for n, i in enumerate(todo, 1):
        results = generate_batch(model, batches[i], max_new, stop_ids, SEED + i)
        _write_shard(out / f"shard-{i:05d}.jsonl", batches[i], results)
        tokens += sum(len(r) for r, _ in results)
        rate = tokens / (time.perf_counter() - start)
        print(f"shard {i} ({n}/{len(todo)}): batch {len(batches[i])}, "
              f"{tokens} tokens, {rate:.1f} tokens/s", flush=True)


def data_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments every data generator takes: where its shards go, and the model."""
    p = argparse.ArgumentParser(description=doc,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model", type=Path, default=None,
                   help="HF-layout folder (default: SmolLM2 from the model cache)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = data_parser(__doc__)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--max-new", type=int, default=160)
    p.add_argument("--limit", type=int, default=None, help="only the first N batches")
    p.add_argument("--part", default="0/1", help="I/N: only batches b with b %% N == I")
    p.add_argument("--list", action="store_true", help="print the prompt set and exit")
    args = p.parse_args(argv)
    if args.list:
        for item in build_prompts():
            print(json.dumps({"task": item.task, "text": item.text}))
        return 0
    if args.model is None:
        from workers.embedded.fetch_model import ensure_smollm2

        args.model = ensure_smollm2()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    index, count = (int(v) for v in args.part.split("/"))
    run(args.out, args.model, args.batch, args.max_new, args.limit, (index, count))
    return 0


if __name__ == "__main__":
    sys.exit(main())
