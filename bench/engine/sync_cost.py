"""`python -m bench.engine.sync_cost`: what the EAGLE head's sync costs on this machine,
against a plain decode step: the `HybridConfig.sync_cost` measurement.

For a prompt of P positions (random tokens; the cost depends on P, not on the text): a
plain decode step after it, a verify of 4 tokens, the head's forward over all P positions
(what a request's first EAGLE step runs: the head reads every position it has not read),
and one head step with its draft logits. One torch thread, as the engine bench runs.

    python -m bench.engine.sync_cost [--positions 64,256,512,1024]
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def timed(fn: Callable[[], object], calls: int) -> float:
    """Mean milliseconds a call, after one warm-up call."""
    fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1e3


def row(model, head, p: int) -> str:  # noqa: ANN001 - the engine's model and EAGLE head
    """One table row for a prompt of `p` positions."""
    import torch

    from workers.embedded.drafter_models import draft_logits

    width, dtype = model.config.hidden_size, head.fc.weight.dtype
    cache = model.new_cache(1, p + 64)
    model(torch.randint(0, model.config.vocab_size, (1, p)), cache)
    cache.commit()
    plain = timed(lambda: (model(torch.tensor([[5]]), cache, last_only=True),
                           cache.rollback(p)), 20)
    verify = timed(lambda: (model(torch.tensor([[5, 6, 7, 8]]), cache), cache.rollback(p)), 20)
    head_cache = head.new_cache(p + 64)
    features = torch.randn(1, p, width, dtype=dtype)
    embeddings = torch.randn(1, p, width, dtype=dtype)
    sync = timed(lambda: (head(features, embeddings, head_cache), head_cache.rollback(0)), 5)
    head(features, embeddings, head_cache)
    head_cache.commit()
    one = torch.randn(1, 1, width, dtype=dtype)
    step = timed(lambda: (draft_logits(head(one, one, head_cache)[0], head.vocabulary,
                                       model.lm_head), head_cache.rollback(p)), 20)
    return (f"| {p} | {plain:.2f} ms | {verify:.2f} ms | {sync:.2f} ms | {sync / plain:.2f} | "
            f"{sync / plain / p:.4f} | {step:.2f} ms ({step / plain:.3f}) |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", default="64,256,512,1024")
    args = parser.parse_args(argv)
    import torch

    from bench.engine.methods import _load_engine
    from workers.models import resolve_model

    torch.set_num_threads(1)
    engine = _load_engine(resolve_model("smollm2"))
    head = engine._methods["eagle"].new_drafter()._eagle.head
    print("| P | plain step | verify 4 | head sync over P | sync in plain steps "
          "| per position | head step + draft logits |")
    print("|---|---|---|---|---|---|---|")
    with torch.inference_mode():
        for p in args.positions.split(","):
            print(row(engine.model, head, int(p)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
