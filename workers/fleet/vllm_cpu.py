"""Running vLLM on a CPU, as `specroute up --engine vllm` and the benches do: the pools and
their `k`, the server flags and environment, the dtype by the CPU, and the project's
drafters exported into vLLM's formats (once, beside the model folder).

Server flags for the CPU (docs/FLEET.md, with the figures): `--enforce-eager` (starts
in a fraction of the time that recompiling the graph at every start takes, and decodes
somewhat slower), `--dtype` by the CPU (`cpu_dtype`), `--max-model-len 2048`, no chunked
prefill (below); `VLLM_CPU_KVCACHE_SPACE=1` (GiB of KV cache) and `HF_HUB_OFFLINE=1` (no
hub at run time).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from workers.models import drafter_dir_for

VLLM_METHODS = {"plain": 0, "ngram": 4, "medusa": 4, "eagle": 3}  # method -> k, in the order of cores
DRAFTER_METHODS = ("medusa", "eagle")  # methods whose checkpoint the stack exports
SERVER_MEMORY_GIB = 5.0  # one SmolLM2 server's RSS (~4 GB) and some room
MAX_MODEL_LEN = 2048
# No chunked prefill: vLLM CPU 0.32 raises in its worker on a seeded request whose
# prefill it chunks (`gpu_model_runner._bookkeeping_sync` rewinds the request's
# generator with `set_offset`: "CPU Generator does not use offset") and the server then
# answers nothing but 500s; 48 concurrent seeded requests of ~150 prompt tokens did it.
# With a step's token budget at the longest context, a prompt waits for a step it fits.
CPU_LAUNCH = {"enforce_eager": True, "max_model_len": MAX_MODEL_LEN,
              "no_enable_chunked_prefill": True, "max_num_batched_tokens": MAX_MODEL_LEN}
SERVER_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}




class DrafterExportError(RuntimeError):
    """The project's drafter could not be exported into vLLM's format."""


def cpu_dtype(cpuinfo: str | None = None) -> str:
    """bfloat16 on a CPU with AVX-512, else float32: without it bf16 is emulated and
    slower than float32 (measured: docs/FLEET.md, "vLLM CPU pools")."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            cpuinfo = ""
    flags = next((line.split(":", 1)[1].split() for line in cpuinfo.splitlines()
                  if line.startswith("flags")), [])
    return "bfloat16" if "avx512f" in flags else "float32"


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
        raise DrafterExportError(f"exporting {source} for vLLM failed: {done.stderr.strip()}")
    return out
