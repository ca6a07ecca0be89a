"""`python -m bench.engine.verify_cost`: what one target forward costs by the positions it
scores (a verify step of d draft tokens scores d + 1), at batch 1, as a share of a plain
step's.

Why a curve and not a cost per drafted token: on the CPU the 4-bit layers run torch's
int4 kernel (`layers.int4_linear`), which multiplies at most four rows in one pass over
the weights (`BLOCK_M = 4`); a fifth position starts a second pass. So the first two
draft tokens cost little, a third more, a fourth much more (the table this prints), and
a drafter's worth depends on how long its drafts are, not only on their mean.

Forwards run after a prompt of `--prefix` positions (rolled back after each), positions
1..`--max-positions` interleaved round by round; each figure is the median over rounds.
`--write PATH` adds the curve to a model's `measured.json` as `verify_costs`
(`[{"positions", "step_s", "ratio"}]`) and `verify_costs_source`, keeping every other key;
`bench.engine.hybrid_variants` reads it for its load-independent table.

    SPECROUTE_BENCH_THREADS=1 python -m bench.engine.verify_cost --rounds 20
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def curve(model, max_positions: int, rounds: int, prefix: int) -> dict[int, float]:
    """Median seconds of one forward by the positions it scores (1..max_positions)."""
    import torch

    from workers.embedded.model import SequenceInput

    cache = model.new_cache(max_length=prefix + max_positions + 1)
    vocab = model.config.vocab_size
    generator = torch.Generator().manual_seed(0)
    times: dict[int, list[float]] = {m: [] for m in range(1, max_positions + 1)}
    with torch.inference_mode():  # the engine's own forward (`Engine.step`)
        model.forward_each([SequenceInput(torch.randint(0, vocab, (prefix,), generator=generator),
                                          cache)])
        cache.commit()
        for _ in range(rounds + 1):  # the first round warms up, not counted
            for m, seen in times.items():
                tokens = torch.randint(0, vocab, (m,), generator=generator)
                start = time.perf_counter()
                model.forward_each([SequenceInput(tokens, cache)])
                seen.append(time.perf_counter() - start)
                cache.rollback(prefix)
    return {m: statistics.median(seen[1:]) for m, seen in times.items()}


def cost_rows(seconds: dict[int, float]) -> list[dict]:
    plain = seconds[1]
    return [{"positions": m, "step_s": round(s, 6), "ratio": round(s / plain, 3)}
            for m, s in sorted(seconds.items())]


def step_cost(verify_costs: list[dict], drafted: int) -> float:
    """A step of `drafted` draft tokens in plain steps, from the curve; past its end, the
    last ratio plus the curve's last slope per position."""
    ratios = {row["positions"]: row["ratio"] for row in verify_costs}
    top = max(ratios)
    positions = drafted + 1
    if positions in ratios:
        return ratios[positions]
    slope = ratios[top] - ratios.get(top - 1, 1.0)
    return ratios[top] + slope * (positions - top)


def main(argv: list[str] | None = None) -> int:
    import torch

    from bench.engine.measured import device_description, write_measured
    from bench.engine.methods import _load_engine
    from workers.models import resolve_model

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--max-positions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--prefix", type=int, default=300)
    parser.add_argument("--write", default=None, help="a measured.json to add the curve to")
    args = parser.parse_args(argv)
    if args.max_positions < 1 or args.rounds < 1 or args.prefix < 1:
        parser.error("--max-positions, --rounds and --prefix must be >= 1")
    threads = int(os.environ.get("SPECROUTE_BENCH_THREADS", "2"))
    torch.set_num_threads(threads)
    engine = _load_engine(resolve_model(args.model))
    rows = cost_rows(curve(engine.model, args.max_positions, args.rounds, args.prefix))
    print("| positions | ms | x plain step |\n|---|---|---|")
    for row in rows:
        print(f"| {row['positions']} | {row['step_s'] * 1e3:.1f} | {row['ratio']:.2f} |")
    if args.write:
        path = Path(args.write)
        document = json.loads(path.read_text())
        document["verify_costs"] = rows
        document["verify_costs_source"] = (
            f"python -m bench.engine.verify_cost --model {args.model} --max-positions "
            f"{args.max_positions} --rounds {args.rounds} --prefix {args.prefix}; "
            + device_description(f"{threads} torch threads"))
        write_measured(path, document)
        print(f"wrote verify_costs to {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
