"""`python -m bench.engine.sync_cost` (the hybrid's `sync_cost` measurement): one table
row per prompt length, run here on a tiny model with an EAGLE head."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tiny_models import half_agreeing_drafters_dir

from bench.engine.sync_cost import row
from workers.embedded.checkpoint import load_model
from workers.embedded.drafter_models import EagleHead, load_drafter

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_a_row_times_the_plain_step_and_the_heads_sync(tmp_path: Path) -> None:
    folder = half_agreeing_drafters_dir(tmp_path, 300)
    model = load_model(folder, dtype=torch.float32).eval()
    head = load_drafter(folder / "eagle", dtype=torch.float32)
    assert isinstance(head, EagleHead)
    with torch.inference_mode():
        line = row(model, head, 24)
    cells = [c.strip() for c in line.strip("|").split("|")]
    assert cells[0] == "24" and len(cells) == 7
    plain, sync = (float(re.match(r"[\d.]+", cells[i]).group()) for i in (1, 3))
    assert plain > 0 and sync > 0
    ratio = float(cells[4])  # from the unrounded times: the printed ms are rounded
    assert ratio == pytest.approx(sync / plain, rel=0.3, abs=0.1) and ratio > 0
    assert float(cells[5]) == pytest.approx(ratio / 24, abs=1e-3)
