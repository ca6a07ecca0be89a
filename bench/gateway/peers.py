"""Other gateways measured beside specroute by `specroute bench gateway`.

Each peer is installed on first use into its own virtualenv under the cache directory
(`$XDG_CACHE_HOME/specroute/peers/<name>`, default `~/.cache/...`; needs PyPI once) at a
pinned version, then launched on 127.0.0.1 in front of the benchmark's upstream. A peer
that cannot be installed or started is reported with the reason, never dropped.

- sglang-router (PyPI `sglang-router`, the Rust router; `python -m
  sglang_router.launch_router`, arguments read from its 0.3.2 `router_args.py`): its
  default policy (`cache_aware`); before it routes it probes the worker's `/health`,
  `/server_info` and `/model_info` (bench/gateway/upstream.py answers them). It also tries to
  fetch a tokenizer for the model name from Hugging Face, fails (no such model, or no
  network) and routes anyway.
- smg (PyPI `smg`, "Shepherd Model Gateway", sglang-router's successor; the `smg` command
  from its 1.13.0 `cli.py`): `smg launch` with `--policy round_robin` and
  `--disable-tokenizer-autoload` (the bench's model name has no tokenizer to fetch).
- LiteLLM proxy (PyPI `litellm[proxy]`; the `litellm` command): one `openai/` model
  pointed at the upstream's `/v1`, `LITELLM_MASTER_KEY` set (the proxy refuses to start
  its auth without one) and `LITELLM_LOCAL_MODEL_COST_MAP=True` so it fetches no price
  list; one worker process, its default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

API_KEY = "sk-bench"  # LiteLLM's master key; every gateway in the bench gets it
INSTALL_TIMEOUT_S = 1200


@dataclass(frozen=True)
class Peer:
    name: str
    requirement: str  # pip requirement, pinned
    probe_module: str  # imported to check an install
    launch: Callable[[Path, int, str, Path], list[str]]  # (venv, port, upstream, tmp) -> argv
    ready_path: str
    env: tuple[tuple[str, str], ...] = ()


def _sglang_router(venv: Path, port: int, upstream: str, tmp: Path) -> list[str]:
    return [str(venv / "bin" / "python"), "-m", "sglang_router.launch_router",
            "--worker-urls", upstream, "--host", "127.0.0.1", "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(_free_port()),
            "--log-level", "warn", "--worker-startup-check-interval", "1"]


def _smg(venv: Path, port: int, upstream: str, tmp: Path) -> list[str]:
    return [str(venv / "bin" / "smg"), "launch", "--host", "127.0.0.1", "--port", str(port),
            "--worker-urls", upstream, "--policy", "round_robin",
            "--disable-tokenizer-autoload"]


def _litellm(venv: Path, port: int, upstream: str, tmp: Path) -> list[str]:
    config = tmp / "litellm.yaml"
    config.write_text(yaml.safe_dump({
        "model_list": [{"model_name": "bench", "litellm_params": {
            "model": "openai/bench", "api_base": f"{upstream}/v1", "api_key": "none"}}],
        "general_settings": {"master_key": API_KEY},
        "litellm_settings": {"drop_params": True, "telemetry": False}}))
    return [str(venv / "bin" / "litellm"), "--config", str(config), "--host", "127.0.0.1",
            "--port", str(port), "--num_workers", "1"]


PEERS: dict[str, Peer] = {
    "sglang-router": Peer("sglang-router", "sglang-router==0.3.2", "sglang_router",
                          _sglang_router, "/health"),
    "smg": Peer("smg", "smg==1.13.0", "smg", _smg, "/health"),
    "litellm": Peer("litellm", "litellm[proxy]==1.108.7", "litellm", _litellm,
                    "/health/liveliness",
                    env=(("LITELLM_MASTER_KEY", API_KEY), ("LITELLM_LOCAL_MODEL_COST_MAP", "True"),
                         ("LITELLM_LOG", "ERROR"), ("LITELLM_TELEMETRY", "False"))),
}


def _free_port() -> int:
    from workers.processes import free_port

    return free_port()


def cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specroute" / "peers"


def install(peer: Peer, root: Path | None = None) -> Path:
    """The peer's virtualenv, created and filled on first use; raises `RuntimeError`
    with the installer's last words when that fails."""
    venv = (root or cache_dir()) / peer.name
    marker = venv / "specroute-installed.json"
    if marker.exists() and json.loads(marker.read_text()).get("requirement") == peer.requirement:
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    steps = [[sys.executable, "-m", "venv", "--clear", str(venv)],
             [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet",
              "--disable-pip-version-check", peer.requirement],
             [str(venv / "bin" / "python"), "-c", f"import {peer.probe_module}"]]
    print(f"installing {peer.requirement} into {venv} (first use) ...", file=sys.stderr)
    for step in steps:
        try:
            done = subprocess.run(step, capture_output=True, text=True,
                                  timeout=INSTALL_TIMEOUT_S, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise RuntimeError(f"{type(exc).__name__}: {exc}") from exc
        if done.returncode != 0:
            lines = [line for line in (done.stderr + done.stdout).splitlines()
                     if line.strip() and not line.startswith("WARNING: Location")]
            raise RuntimeError(lines[-1][:200] if lines else f"exit {done.returncode}")
    marker.write_text(json.dumps({"requirement": peer.requirement}))
    return venv


def environment(peer: Peer) -> dict[str, str]:
    return {**os.environ, **dict(peer.env)}
