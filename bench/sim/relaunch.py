"""Relaunch costs per engine, read from where this repo records them (never a constant
that can drift from the record).

- `vllm`: a vLLM CPU pool's drain and relaunch through `specroute supervise`, measured
  live: "relaunched the server (93 s to serve again)" in docs/results/2026-12-01-vllm.md.
  Checked against the other two records: one eager server starts in 30-40 s
  (docs/FLEET.md, "Eager mode starts in 30-40 s") and the whole stack (Redis, gateway,
  two servers) was ready in 118 s (docs/results/2026-12-02-vllm.md, "stack ready in
  118 s"); the drain is what lies between.
- `sglang`: SGLang's start-up, 90 s, the midpoint of sglang issue #509's 1-2 minutes
  (docs/FLEET.md, "takes a relaunch as 90 s out of service"): a published figure, not
  measured here (no GPU on this machine).

`relaunch_s(engine)` returns the figure; `records()` every figure with its source, for
the report.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True)
class Record:
    name: str
    path: str  # relative to the repository root
    pattern: str  # one or two groups: a figure, or a range whose midpoint is taken
    what: str


RECORDS = (
    Record("vllm", "docs/results/2026-12-01-vllm.md",
           r"relaunched the server \((\d+) s to serve again\)",
           "vLLM CPU pool: drain + relaunch through the supervisor (measured)"),
    Record("vllm-eager-start", "docs/FLEET.md", r"Eager mode starts in (\d+)-(\d+) s",
           "vLLM CPU server start, eager (measured)"),
    Record("vllm-stack-ready", "docs/results/2026-12-02-vllm.md",
           r"stack ready in (\d+) s", "vLLM CPU stack ready: Redis, gateway, 2 servers"),
    Record("sglang", "docs/FLEET.md", r"takes a relaunch as (\d+) s out of service",
           "SGLang start-up (sglang issue #509's 1-2 minutes; published)"),
)


@cache
def read(name: str) -> float:
    record = next((r for r in RECORDS if r.name == name), None)
    if record is None:
        raise KeyError(f"no relaunch record named {name!r}")
    text = (ROOT / record.path).read_text(encoding="utf-8")
    match = re.search(record.pattern, " ".join(text.split()))
    if match is None:
        raise ValueError(f"{record.path} no longer records {record.what!r} "
                         f"(pattern {record.pattern!r})")
    figures = [float(g) for g in match.groups()]
    return sum(figures) / len(figures)


def relaunch_s(engine: str) -> float:
    """Seconds a pool of `engine` ("sglang" or "vllm") serves nothing when relaunched."""
    return read(engine)


def records() -> dict[str, float]:
    return {r.name: read(r.name) for r in RECORDS}
