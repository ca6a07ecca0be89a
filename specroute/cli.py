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
    )


def _gateway(args: argparse.Namespace) -> int:
    from gateway.http.serve import serve

    return serve(config_path=args.config, host=args.host, port=args.port, policy=args.policy,
                 workers=args.workers)


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


def _bench(args: argparse.Namespace) -> int:
    if args.target == "gateway":
        from bench.gateway import main as bench_main
    elif args.target == "engine":
        from bench.engine import main as bench_main
    elif args.target == "policy":
        from bench.policy import main as bench_main
    elif args.target == "batching":
        from bench.batching import main as bench_main
    elif args.target == "slo":
        from bench.slo import main as bench_main
    elif args.target == "soak":
        from bench.soak import main as bench_main
    elif args.target == "classifier":
        from bench.classifier import main as bench_main
    else:
        from bench.live import main as bench_main
    return bench_main(args)


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

    bench = sub.add_parser("bench", help="benchmarks; each prints a table")
    bench.add_argument("target", choices=["gateway", "engine", "policy", "live", "batching",
                                          "slo", "soak", "classifier"])
    bench.add_argument("--json", action="store_true", help="print one JSON object last")
    bench.add_argument("--quick", action="store_true", help="a short run (for smoke tests)")
    bench.add_argument("--plot", default=None, help="policy: write a PNG of tokens/s over time")
    bench.add_argument("--fleet", action="store_true",
                       help="policy: the fleet planner's fixed-k fleet against its baselines")
    bench.add_argument("--url", default=None, help="gateway: an already running gateway")
    bench.add_argument("--seed", type=int, default=0)
    bench.add_argument("--duration", type=float, default=None,
                       help="slo: seconds of load per mode (default 30; --quick 8)")
    bench.add_argument("--rounds", type=int, default=None,
                       help="engine, gateway: interleaved rounds (default 3; --quick 1); "
                       "batching: default 2")
    bench.add_argument("--steps", type=int, default=None,
                       help="batching: decode steps timed per setting and round "
                       "(default 24; --quick 4)")
    bench.add_argument("--write-costs", default=None, metavar="PATH",
                       help="batching: replace the costs list (seconds per decode step by "
                       "method, k, batch) of the measured.json at PATH")
    bench.add_argument("--throughput", action="store_true",
                       help="batching: also aggregate tokens/s at concurrency 1, 2, 4")
    bench.add_argument("--peers", default="sglang-router,litellm",
                       help="gateway: other gateways measured beside specroute, installed "
                       "on first use (default: sglang-router,litellm; 'none' for none)")
    bench.add_argument("--gateway-workers", default="1",
                       help="gateway: specroute process counts to measure, e.g. 1,2 "
                       "(default 1)")
    bench.add_argument("--prompts", type=int, default=None,
                       help="engine: prompts per class and round (default 2; --quick 1)")
    bench.add_argument("--write-measured", default=None, metavar="PATH",
                       help="engine: write accept length, tokens/s and speedup per "
                       "(method, class, T) as JSON, the policy's prior for the worker")
    bench.add_argument("--model", default=None,
                       help="engine, live, batching: smollm2 (default), tiny, or a model folder")
    bench.add_argument("--methods", default=None,
                       help="engine, batching: methods to compare; live: the pools (default: "
                       "every method)")
    bench.add_argument("--concurrency", default=None,
                       help="live: comma-separated requests in flight, measured in turn "
                       "(default 1,4); soak: clients (default 64)")
    bench.add_argument("--minutes", type=float, default=None,
                       help="soak: how long the load runs (default 5; --quick 0.5)")
    bench.add_argument("--faults", default="worker,redis",
                       help="soak: faults to inject, comma-separated: worker, redis, or none")
    bench.add_argument("--per-cell", type=int, default=None,
                       help="live: prompts per task x temperature (default 1)")
    bench.add_argument("--classes", default=None,
                       help="live: the workload's classes, comma-separated task/temperature "
                       "(e.g. edit/t0,edit/t0.8; default every task at T 0 and 0.8)")
    bench.add_argument("--warmup", type=int, default=None,
                       help="live: warm-up requests of the warm gateway (default 18; --quick 6)")
    bench.add_argument("--max-tokens", type=int, default=48,
                       help="engine, live: tokens per request (engine --quick: 16)")
    bench.add_argument("--workdir", default=None, help="live: keep the stack's logs here")
    bench.add_argument("--records", default=None,
                       help="live: write every request's record and the summary to this JSON file")
    bench.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
