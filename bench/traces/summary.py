"""Summarize recorded traces per category and method (the table in docs/TRACES.md).

    python -m bench.traces.summary DIR [--markdown]

Per category and method: requests, mean accept length (tokens per verify step, the
prefill's first token left out: sum(accept_lengths) / steps over the category), decode
speed against plain (decode tokens per second over plain's on the same requests, each
summed over the category; decode time is the sum of `step_ms`, the prefill left out), and how often
greedy output differed from plain decoding's. Then per category, per request: how often
n-gram beats EAGLE by tokens per step, and by measured decode time per output token.
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

from bench.traces.record import TRACES


def load(folder: Path) -> list[dict]:
    with open(folder / TRACES) as handle:
        return [json.loads(line) for line in handle]


def complete(rows: list[dict]) -> dict[str, dict[str, dict]]:
    """id -> method -> row, for ids with a plain row."""
    by_id: dict[str, dict[str, dict]] = defaultdict(dict)
    for row in rows:
        by_id[row["id"]][row["method"]] = row
    return {i: methods for i, methods in by_id.items() if "plain" in methods}


def per_token_ms(row: dict) -> float:
    return sum(row["step_ms"]) / max(row["output_tokens"] - 1, 1)


def tokens_per_step(row: dict) -> float:
    return sum(row["accept_lengths"]) / max(row["steps"], 1)


def _rate(rows: list[dict]) -> float:
    """Decode tokens per ms over the rows (the prefill's token and time left out)."""
    ms = sum(sum(r["step_ms"]) for r in rows)
    return sum(r["output_tokens"] - 1 for r in rows) / ms if ms else 0.0


def method_table(traces: dict[str, dict[str, dict]]) -> list[dict]:
    cells: dict[tuple[str, str], list[tuple[dict, dict]]] = defaultdict(list)
    for methods in traces.values():
        plain = methods["plain"]
        for method, row in methods.items():
            cells[(row["category"], method)].append((row, plain))
    table = []
    for (category, method), pairs in sorted(cells.items()):
        steps = sum(r["steps"] for r, _ in pairs)
        accepted = sum(sum(r["accept_lengths"]) for r, _ in pairs)
        rate = _rate([r for r, _ in pairs])
        plain = _rate([p for _, p in pairs])
        table.append({"category": category, "method": method, "requests": len(pairs),
                      "accept_length": accepted / max(steps, 1),
                      "speedup": rate / plain if plain else 0.0,
                      "mismatches": sum(not r["greedy_match"] for r, _ in pairs)})
    return table


def ngram_vs_eagle(traces: dict[str, dict[str, dict]]) -> list[dict]:
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0])
    for methods in traces.values():
        if "ngram" in methods and "eagle" in methods:
            ngram, eagle = methods["ngram"], methods["eagle"]
            count = counts[ngram["category"]]
            count[0] += 1
            count[1] += tokens_per_step(ngram) > tokens_per_step(eagle)
            count[2] += per_token_ms(ngram) < per_token_ms(eagle)
    return [{"category": c, "requests": n, "by_tokens_per_step": a, "by_time": t}
            for c, (n, a, t) in sorted(counts.items())]


def markdown(folder: Path) -> str:
    traces = complete(load(folder))
    lines = ["| category | method | requests | mean accept length | decode speed vs plain | "
             "output ≠ plain |", "|---|---|---|---|---|---|"]
    for r in method_table(traces):
        lines.append(f"| {r['category']} | {r['method']} | {r['requests']} | "
                     f"{r['accept_length']:.2f} | {r['speedup']:.2f}x | {r['mismatches']} |")
    lines += ["", "| category | requests | n-gram beats EAGLE: tokens per step | "
              "by decode time per token |", "|---|---|---|---|"]
    total = [0, 0, 0]
    for r in ngram_vs_eagle(traces):
        n, a, t = r["requests"], r["by_tokens_per_step"], r["by_time"]
        total = [total[0] + n, total[1] + a, total[2] + t]
        lines.append(f"| {r['category']} | {n} | {a} ({a / n:.0%}) | {t} ({t / n:.0%}) |")
    n, a, t = total
    if n:
        lines.append(f"| all | {n} | {a} ({a / n:.0%}) | {t} ({t / n:.0%}) |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    args = parser.parse_args(argv)
    print(markdown(args.folder))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
