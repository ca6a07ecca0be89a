"""The code-edit diagnostic's label: how much of a dataset's answer copies its input."""

from __future__ import annotations

import pytest

from bench.training.classifier.edits import copy_share, training

CODE = "def total(xs):\n    result = 0\n    for x in xs:\n        result += x\n    return result\n"


def test_an_edited_function_copies_its_input_and_a_new_one_does_not() -> None:
    edited = CODE.replace("result = 0", "result = 0.0")
    assert copy_share(CODE, edited) > 0.8
    assert copy_share(CODE, "import math\nprint(math.fsum([1, 2, 3]))\n") < 0.2
    assert copy_share(CODE, "ok") == 0.0  # too short to hold a run


def test_held_out_prompts_are_refused(tmp_path) -> None:
    held_out = tmp_path / "heldout" / "prompts.jsonl"
    held_out.parent.mkdir()
    held_out.write_text("")
    with pytest.raises(SystemExit):
        training(held_out, 0)
