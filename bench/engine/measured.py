"""The `measured.json` a benchmark writes: what a pool's servers measured about
themselves, the policy's prior and the fleet planner's launch benchmark (schema:
policies/prior.py). `specroute bench engine` and `specroute bench vllm` both write it here.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
from pathlib import Path

from policies.prior import Measured
from policies.types import TASKS

ENTRY_KEYS = ("method", "k", "task", "temperature", "accept_length", "tokens_per_s",
              "speedup", "requests")


def device_description(detail: str) -> str:
    """The CPU, its cores and `detail` (threads, dtype, engine)."""
    cpu = platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"cpu: {cpu}, {os.cpu_count()} cores, {detail}"


def measured_document(model: str, source: str, device: str, rows: list[dict]) -> dict:
    """The document of a bench's rows (one per method, k and class, with `ENTRY_KEYS`);
    rows of a task the policy does not classify (the engine bench's `schema`) are left out."""
    return {"model": model, "source": source,
            "measured_at": datetime.date.today().isoformat(), "device": device,
            "entries": [{key: r[key] for key in ENTRY_KEYS} for r in rows
                        if r["task"] in TASKS]}


def write_measured(path: str | Path, document: dict) -> None:
    """Write `document` to `path` (its folder made), checked against the schema first."""
    Measured.from_dict(document)
    out = Path(path).expanduser()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(document, indent=1) + "\n")
