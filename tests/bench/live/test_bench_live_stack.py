"""`specroute bench live` through real stacks (the bundled tiny model: real `specroute up`,
gateways, Redis and workers): an adaptive fleet and a homogeneous one of the same size
serve the same prompts; the adaptive gateway learned from exactly its own requests and
the homogeneous one, whose requests are all pinned, from none."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from bench.live.fleets import ADAPTIVE, fleets
from bench.live.prompts import plan
from bench.live.run import Settings, run_fleets
from workers.models import BUNDLED_MODEL_DIR

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (BUNDLED_MODEL_DIR / "config.json").exists(),
                                 reason="no bundled model")]


def test_equal_fleets_serve_the_same_prompts_and_pinned_traffic_teaches_nothing(
        tmp_path: Path) -> None:
    settings = Settings(engine="embedded", methods=("plain", "ngram"),
                        homogeneous=("ngram",), per_class=2, warmup=3, max_tokens=6,
                        concurrency=(1, 2), replicates=1, seed=0, ks=("1", "3"),
                        model=str(BUNDLED_MODEL_DIR), classes=("code/t0", "edit/t0"))
    prompts = plan("", 2, 3, (1, 2), 1, 0, 6, held_out=False,
                   classes=("code/t0", "edit/t0"))
    adaptive, homogeneous = fleets("embedded", ["plain", "ngram"], ["ngram"], settings.ks)
    assert homogeneous.name == "2xngram" and len(homogeneous.methods) == 2
    records, audits = run_fleets(random.Random(0).sample([adaptive, homogeneous], 2),
                                 settings, prompts, 0, tmp_path, 0.0)
    assert not [r for r in records if r.error]
    by_fleet = {a["fleet"]: a for a in audits}
    # adaptive: 3 warm-up + 4 prompts at each of 2 concurrencies, all learned from
    assert by_fleet[ADAPTIVE] == {"fleet": ADAPTIVE, "replicate": 0, "adaptive_requests": 11,
                                  "learned_from": 11, "pinned": 0, "clean": True}
    # homogeneous: its warm-up (3) and 2 configurations x 8 prompts, every one pinned
    assert by_fleet["2xngram"]["learned_from"] == 0 and by_fleet["2xngram"]["pinned"] == 19
    for conc in (1, 2):
        served = {c: sorted(r.item for r in records if r.concurrency == conc and r.config == c)
                  for c in {r.config for r in records}}
        assert set(served) == {ADAPTIVE, "ngram k=1", "ngram k=3"}
        assert len({tuple(v) for v in served.values()}) == 1  # the same prompts, each once
    assert {r.pool for r in records if r.config == "ngram k=3"} == {"embedded-ngram"}
    assert {r.k for r in records if r.config == "ngram k=3"} == {3}
