"""The `specroute` command line: the only module that parses arguments.

Each subcommand imports its implementation lazily, so `specroute gateway` never
imports torch and `specroute --help` stays instant.
"""

from __future__ import annotations

import argparse
import sys

from policies.rules import POLICY_NAMES  # light: no numpy, no gateway


def _up(args: argparse.Namespace) -> int:
    from specroute.stack import run_stack

    return run_stack(
        host=args.host,
        port=args.port,
        methods=args.methods,
        model_dir=args.model,
        redis_url=args.redis_url,
        workdir=args.workdir,
        engine=args.engine,
        follow_fleet=args.follow_fleet,
        measured=not args.no_measured,
    )


def _gateway(args: argparse.Namespace) -> int:
    from gateway.http.serve import serve

    return serve(config_path=args.config, host=args.host, port=args.port, policy=args.policy,
                 workers=args.workers)


def _picker(args: argparse.Namespace) -> int:
    from gateway.picker.server import run

    return run(args.config, args.host, args.port, args.policy, args.max_endpoints,
               args.metrics_port)


def _worker(args: argparse.Namespace) -> int:
    from workers.embedded.server import serve_worker

    return serve_worker(
        method=args.method,
        host=args.host,
        port=args.port,
        model_dir=args.model,
        num_speculative_tokens=args.num_speculative_tokens,
        threads=args.threads,
        redis_url=args.redis_url,
        pool=args.pool,
    )


def _supervise(args: argparse.Namespace) -> int:
    from workers.fleet.service import supervise

    return supervise(
        config_path=args.config,
        pool=args.pool,
        command_template=args.command,
        port=args.port,
        redis_url=args.redis_url,
        follow_fleet=args.follow_fleet,
        min_workers=args.min_workers,
    )


def _keys(args: argparse.Namespace) -> int:
    from gateway.config import ConfigError
    from gateway.tenants.keys import add_key

    settings = {name: value for name, value in (
        ("slo_ttft_ms", args.slo_ttft_ms), ("slo_tpot_ms", args.slo_tpot_ms),
        ("priority", args.priority)) if value is not None}
    try:
        key = add_key(args.config, args.tenant, settings)
    except ConfigError as exc:
        print(f"specroute keys: {exc}", file=sys.stderr)
        return 2
    print(key)
    print(f"# the only time this key is shown; {args.config} holds its sha256 only",
          file=sys.stderr)
    return 0


def _fleet_controller(args: argparse.Namespace) -> int:
    from workers.fleet.k8s_controller import run_controller

    return run_controller(config_path=args.config, model=args.model, namespace=args.namespace,
                          redis_url=args.redis_url, min_workers=args.min_workers,
                          interval_s=args.interval)


# Each bench's own options (`specroute bench NAME --help` lists only its own): the flag's
# type and default once here, its help per bench below.
BENCH_OPTIONS: dict[str, dict] = {
    "--seed": {"type": int, "default": 0},
    "--rounds": {"type": int, "default": None},
    "--steps": {"type": int, "default": None},
    "--prompts": {"type": int, "default": None},
    "--per-cell": {"type": int, "default": None},
    "--per-class": {"type": int, "default": None},
    "--warmup": {"type": int, "default": None},
    "--max-tokens": {"type": int, "default": 48},
    "--duration": {"type": float, "default": None},
    "--minutes": {"type": float, "default": None},
    "--model": {"default": None},
    "--methods": {"default": None},
    "--concurrency": {"default": None},
    "--classes": {"default": None},
    "--workdir": {"default": None},
    "--records": {"default": None},
    "--plot": {"default": None},
    "--peers": {"default": "smg,sglang-router,litellm"},
    "--gateway-workers": {"default": "1"},
    "--faults": {"default": "worker,redis"},
    "--write-costs": {"default": None, "metavar": "PATH"},
    "--write-measured": {"default": None, "metavar": "PATH"},
    "--fleet": {"action": "store_true"},
    "--compare": {"default": None, "choices": ["vllm"]},
    "--mixed": {"type": int, "default": None},
    "--cores": {"default": "0"},
    "--seeds": {"default": None},
    "--full": {"action": "store_true"},
    "--edit-share": {"type": float, "default": None},
    "--throughput": {"action": "store_true"},
    "--engine": {"default": None, "choices": ["embedded", "vllm"]},
    "--replicates": {"type": int, "default": None},
    "--homogeneous": {"default": None},
    "--ks": {"default": None},
    "--merge": {"default": None, "metavar": "FILES"},
    "--categories": {"default": None, "metavar": "FILE"},
    "--scale": {"type": float, "default": None},
    "--follow-fleet": {"action": "store_true"},
    "--traces": {"default": None, "metavar": "PATH"},
    "--learning-unit": {"default": None, "choices": ["class", "pool"]},
    "--prompt-file": {"default": None, "metavar": "PATH"},
    "--temperatures": {"default": None},
    "--body-mode": {"default": "BUFFERED",
                    "choices": ["BUFFERED", "FULL_DUPLEX_STREAMED", "STREAMED"]},
}
MODEL_HELP = "smollm2 (default), tiny, or a model folder"
BENCHES: dict[str, tuple[str, dict[str, str | tuple[str, dict]]]] = {
    "gateway": ("the gateway's own overhead beside other gateways, side by side", {
        "--rounds": "interleaved rounds (default 3; --quick 1)",
        "--peers": "other gateways measured beside specroute, installed on first use "
                   "(default: smg,sglang-router,litellm; 'none' for none)",
        "--gateway-workers": "specroute process counts to measure, e.g. 1,2 (default 1)"}),
    "engine": ("the embedded engine: every method against plain decoding", {
        "--model": MODEL_HELP, "--methods": "methods to compare, method:k for a k (default: every method)",
        "--prompts": "prompts per class and round (default 2; --quick 1)",
        "--rounds": "interleaved rounds (default 3; --quick 1)", "--seed": "prompt seed",
        "--max-tokens": "tokens per request (--quick: 16)",
        "--prompt-file": "a prompts JSONL (bench/traces/data/prompts.jsonl, or heldout/ for "
                         "measuring only): one cell per category, timed from the first token",
        "--temperatures": "comma-separated temperatures (default 0,0.8)",
        "--write-measured": "write accept length, tokens/s and speedup per (method, class, "
                            "T) as JSON, the policy's prior for the worker",
        "--compare": "vllm: the same methods, prompts and cores on vLLM CPU, side by side "
                     "(c = 1 and 4; --prompts per class, default 3)",
        "--cores": "--compare: the cores each server is bound to, e.g. 0 or 0-1 (default 0)",
        "--workdir": "--compare: keep the servers' logs here"}),
    "policy": ("the learned policy in the simulator against its baselines", {
        "--seeds": "comma-separated simulation seeds (default 0,7)",
        "--edit-share": "share of edit requests per phase (default 0.2; 0: the world before)",
        "--full": "the full workload (10,500 requests per seed; default 0.3 of it)",
        "--scale": "the share of the full workload to run (default 0.3; --full: 1)",
        "--plot": "write a PNG of tokens/s over time",
        "--fleet": "the fleet planner's fixed-k fleet against its baselines (--seed)",
        "--seed": "the --fleet run's seed"}),
    "batching": ("step cost per (method, k, batch) of the embedded engine", {
        "--model": MODEL_HELP, "--methods": "methods to compare (default: every method)",
        "--rounds": "rounds (default 2; --quick 1)", "--seed": "prompt seed",
        "--steps": "decode steps timed per setting and round (default 24; --quick 4)",
        "--write-costs": "replace the costs list (seconds per decode step by method, k, "
                         "batch) of the measured.json at PATH",
        "--throughput": "also aggregate tokens/s at concurrency 1, 2, 4",
        "--max-tokens": "tokens per request of --throughput"}),
    "step": ("where one decode step of the embedded engine spends its time (torch profiler)", {
        "--model": MODEL_HELP,
        "--methods": "methods to profile, method:k for a k (default plain,eagle,medusa)",
        "--steps": "decode steps profiled per method (default 20; --quick 4)"}),
    "slo": ("tenants' SLOs under overload, with and without the SLO layer", {
        "--duration": "seconds of load per mode (default 30; --quick 8)", "--seed": "seed"}),
    "soak": ("the whole stack under load for minutes, faults injected", {
        "--concurrency": "clients (default 64)",
        "--minutes": "how long the load runs (default 5; --quick 0.5)",
        "--faults": "faults to inject, comma-separated: worker, redis, or none"}),
    "classifier": ("the request classifier on its held-out prompts", {
        "--categories": "also a JSONL of prompts with a `category` and `messages` (e.g. "
                     "bench/traces/data/prompts.jsonl, built by `python -m "
                     "bench.traces.sources --clones DIR`): the task given, per category"}),
    "traces": ("recorded acceptance traces replayed for fleets of fixed-k pools: tokens/s "
               "against the best homogeneous fleet at batch 1, 8, 32", {
        "--traces": "a traces.jsonl (or its folder) recorded by bench/traces/record.py "
                    "(default bench/traces/data/smollm2)",
        "--prompts": ("their prompts JSONL (default bench/traces/data/prompts.jsonl: fetched "
                      "text, not in git; `python -m bench.traces.sources --clones DIR` "
                      "builds it)",
                      {"type": str, "metavar": "PATH"}),
        "--seeds": "comma-separated replicate seeds: request order and mix draws "
                   "(default 0,1,2; --quick 0)",
        "--learning-unit": "the policy's `learning_unit`: class (default) or pool"}),
    "memory": ("the `specroute up` stack's memory: PSS summed over its processes, ready and "
               "after a request to every pool", {"--model": MODEL_HELP}),
    "picker": ("specroute as Envoy's endpoint picker beside Envoy alone, the gateway and "
               "smg; the picker's decision latency", {
        "--rounds": "interleaved rounds (default 3; --quick 1)",
        "--peers": "'none': without smg (default: smg)",
        "--body-mode": "the picker's request body mode: BUFFERED (default), "
                       "FULL_DUPLEX_STREAMED or STREAMED"}),
    "vllm": ("real vLLM CPU pools through the gateway: n-gram against plain, and what the "
             "policy learns of their acceptance", {
        "--methods": "the vLLM pools, plain among them (default plain,ngram)",
        "--prompts": "prompts per class (default 4; --quick 2)",
        "--rounds": "rounds over the pinned pools (default 2; --quick 1)",
        "--per-class": "unpinned requests per class the policy learns from (default 50; "
                       "--quick 6)",
        "--mixed": "unpinned mixed requests (chat, stream, completions, JSON; default 200; "
                   "--quick 20)",
        "--max-tokens": "tokens per request", "--seed": "bootstrap seed",
        "--workdir": "keep the stack's logs here",
        "--write-measured": "write accept length, tokens/s and speedup per (pool's method, "
                            "k, class) as JSON; `specroute up --engine vllm` reads "
                            "~/.cache/specroute/measured/vllm-<model>.json"}),
    "live": ("the adaptive gateway against equal homogeneous fleets and a held-out oracle, "
             "with bootstrap intervals", {
        "--engine": "embedded workers (default) or vLLM CPU servers",
        "--model": MODEL_HELP,
        "--methods": "the adaptive fleet, one server per method (default embedded "
                     "plain,ngram,eagle,eagle2; vllm plain,ngram)",
        "--homogeneous": "methods measured as fleets of as many servers of one method "
                         "(default embedded plain,ngram,eagle,eagle2; vllm plain,ngram,eagle)",
        "--ks": "embedded: the k's pinned, e.g. 1,2,4,ngram:6 (ngram:6: that method only; "
                "default every k the adaptive fleet's pool may pick, 1..16)",
        "--concurrency": "comma-separated requests in flight, measured in turn (default 1,4)",
        "--per-class": "fresh prompts per class, replicate and concurrency (default 4; "
                       "--quick 2)",
        "--replicates": "replicates, fleets in a new random order each (default 3; --quick 1)",
        "--warmup": "requests the adaptive fleet learns from before measuring (default 60; "
                    "--quick 10)",
        "--classes": "measure only these classes, comma-separated task/temperature (default "
                     "every class of the stated mixes; a mix is reported when all its are)",
        "--max-tokens": "tokens per request", "--seed": "prompt and order seed",
        "--workdir": "keep the stacks' logs here",
        "--records": "write every request's record to this JSON file",
        "--merge": "report on these comma-separated --records files instead of running",
        "--follow-fleet": "vllm: the adaptive fleet's servers move between its pools as the "
                          "gateway's fleet planner wants (`specroute up --follow-fleet`)",
        "--prompts": ("held-out public prompts (JSONL with category and messages, as "
                      "bench.traces.heldout writes): measure their categories at T 0 and "
                      "report the held-out mixes (the warm-up stays on the workload)",
                      {"type": str, "metavar": "FILE"})}),
}


# Each bench's module in the offline distribution, under bench/ (folders by purpose).
BENCH_MODULES = {
    "gateway": "gateway.overhead", "picker": "gateway.picker", "slo": "gateway.slo",
    "soak": "gateway.soak", "classifier": "gateway.classifier",
    "engine": "engine.methods", "batching": "engine.batching", "step": "engine.step_profile",
    "memory": "engine.memory", "vllm": "engine.vllm",
    "policy": "sim.policy", "live": "live.run", "traces": "traces.run",
}


def _bench(args: argparse.Namespace) -> int:
    """Run bench `args.target` from the offline distribution (bench/, `specroute-bench`)."""
    import importlib

    try:
        name = f"bench.{BENCH_MODULES[args.target]}"
        module = importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name not in ("bench", name):
            raise
        print("specroute bench needs the offline distribution: pip install -e ./bench "
              "(from a clone of the repository)", file=sys.stderr)
        return 2
    try:
        return module.main(args)
    except FileNotFoundError as exc:  # fetched data is kept out of git: say how to build it
        from bench.traces.sources import rebuild_hint

        hint = rebuild_hint(exc.filename)
        if hint is None:
            raise
        print(f"specroute bench {args.target}: {hint}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="specroute", description="Adaptive speculation gateway for LLM serving."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    up = sub.add_parser("up", help="run Redis, embedded workers and the gateway locally")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--port", type=int, default=8000)
    up.add_argument(
        "--methods",
        default=None,
        help="comma-separated embedded methods to start (default: every available method)",
    )
    up.add_argument("--model", default=None,
                    help="smollm2 (default: SmolLM2-135M-Instruct, fetched on first use), "
                    "tiny (the bundled test model), or a model folder")
    up.add_argument("--redis-url", default=None, help="use this Redis instead of an embedded one")
    up.add_argument("--workdir", default=".specroute", help="where the generated config lives")
    up.add_argument("--engine", choices=["embedded", "vllm"], default="embedded",
                    help="embedded workers (default) or vLLM CPU servers (installed into "
                    "their own virtualenv on first use; pools plain and ngram)")
    up.add_argument("--follow-fleet", action="store_true",
                    help="vllm: each server's supervisor moves it to the pool the gateway's "
                    "fleet planner wants (docs/FLEET.md), one server at a time")
    up.add_argument("--no-measured", action="store_true",
                    help="vllm: the pools name no measured.json, even when `bench vllm "
                    "--write-measured` left one in ~/.cache/specroute/measured/")
    up.set_defaults(func=_up)

    gw = sub.add_parser("gateway", help="run the gateway alone")
    gw.add_argument("--config", required=True, help="YAML config with pools and tenants")
    gw.add_argument("--host", default=None, help="override the config's listen host")
    gw.add_argument("--port", type=int, default=None, help="override the config's listen port")
    gw.add_argument(
        "--policy",
        choices=POLICY_NAMES,
        default="learned",
        help="routing policy: learned (default; learns from telemetry), static "
        "(class -> method rules) or first (first pool with a healthy worker)",
    )
    gw.add_argument("--workers", type=int, default=1,
                    help="gateway processes sharing the port (default 1); they share what "
                    "the policy learns through the config's redis_url")
    gw.set_defaults(func=_gateway)

    pk = sub.add_parser("picker", aliases=["epp"], help="run as an Envoy ext_proc endpoint "
                        "picker (Gateway API Inference Extension; docs/PICKER.md)")
    pk.add_argument("--config", required=True, help="the gateway's YAML config")
    pk.add_argument("--host", default=None, help="default: the config's server.host")
    pk.add_argument("--port", type=int, default=9002, help="gRPC port (ext_proc and health)")
    pk.add_argument("--policy", choices=POLICY_NAMES, default="learned")
    pk.add_argument("--max-endpoints", type=int, default=None, help="endpoints per pick, "
                    "fallbacks included (default: server.max_attempts; 1 for ORIGINAL_DST)")
    pk.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics")
    pk.set_defaults(func=_picker)

    wk = sub.add_parser("worker", help="run one embedded speculative-decoding worker")
    wk.add_argument("--method", default="plain")
    wk.add_argument("--host", default="127.0.0.1")
    wk.add_argument("--port", type=int, default=30000)
    wk.add_argument("--model", default=None, help="model folder (default: the bundled model)")
    wk.add_argument("--num-speculative-tokens", type=int, default=None)
    wk.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch threads (default 1: on a shared CPU, more threads wait on each other)",
    )
    wk.add_argument("--redis-url", default=None, help="register in this Redis with a heartbeat")
    wk.add_argument("--pool", default=None, help="pool name to register under")
    wk.set_defaults(func=_worker)

    sv = sub.add_parser("supervise", help="run and relaunch one pool's inference server")
    sv.add_argument("--config", required=True)
    sv.add_argument("--pool", required=True)
    sv.add_argument(
        "--command",
        default=None,
        help="server command template; {port}, {k} and {method} are filled in "
        "(default: the SGLang launch command built for the pool)",
    )
    sv.add_argument("--port", type=int, default=None)
    sv.add_argument("--redis-url", default=None)
    sv.add_argument("--follow-fleet", action="store_true",
                    help="move between the model's pools as the fleet planner wants "
                    "(--pool: where to start without a desired fleet)")
    sv.add_argument("--min-workers", type=int, default=1,
                    help="with --follow-fleet: never fewer serving workers of the model")
    sv.set_defaults(func=_supervise)

    keys = sub.add_parser("keys", help="API keys of tenants")
    keys_sub = keys.add_subparsers(dest="action", required=True)
    add = keys_sub.add_parser("add", help="print a new key for TENANT once; write its sha256")
    add.add_argument("tenant")
    add.add_argument("--config", required=True, help="the gateway config (or its tenants_file "
                     "when it names one) gets the digest")
    add.add_argument("--slo-ttft-ms", type=float, default=None, help="for a new tenant")
    add.add_argument("--slo-tpot-ms", type=float, default=None, help="for a new tenant")
    add.add_argument("--priority", type=int, default=None, help="for a new tenant")
    add.set_defaults(func=_keys)

    fc = sub.add_parser("fleet-controller",
                        help="Kubernetes: scale the pool Deployments to the desired fleet")
    fc.add_argument("--config", required=True)
    fc.add_argument("--model", required=True, help="the served model whose pools it scales")
    fc.add_argument("--namespace", default="specroute")
    fc.add_argument("--redis-url", default=None)
    fc.add_argument("--min-workers", type=int, default=1)
    fc.add_argument("--interval", type=float, default=10.0, help="seconds between checks")
    fc.set_defaults(func=_fleet_controller)

    bench = sub.add_parser("bench", help="benchmarks; each prints a table (specroute-bench, "
                           "bench/)")
    targets = bench.add_subparsers(dest="target", required=True, metavar="BENCH")
    for name, (summary, options) in BENCHES.items():
        one = targets.add_parser(name, help=summary, description=summary)
        one.add_argument("--json", action="store_true", help="print one JSON object last")
        one.add_argument("--quick", action="store_true", help="a short run (for smoke tests)")
        for flag, text in options.items():
            # a bench may take a shared flag with its own type: (help, overrides)
            help_text, own = text if isinstance(text, tuple) else (text, {})
            one.add_argument(flag, help=help_text, **{**BENCH_OPTIONS[flag], **own})
        one.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
