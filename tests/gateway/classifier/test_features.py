"""The drafter predictor's features and predictions through the classifier: what the
gateway computes for a request, with bounded work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import policies.predictor as predictor_module
from bench.gateway.classifier import chat_request
from gateway.classifier import prediction
from gateway.classifier.classify import classify, request_vector
from gateway.classifier.features import FEATURES, HEAD_CHARS, TAIL_CHARS, request_features, window
from gateway.schemas import parse_request
from policies.predictor import DEFAULT_PATH

PASSAGE = ("The harbour town was founded in 1602 by fishermen from the north coast. A fire in "
           "1741 destroyed most of the wooden houses near the quay, and the town was rebuilt "
           "in stone over the following decade. The lighthouse, built in 1788, still guides "
           "boats into the narrow channel. ") * 3


def _predicted(text: str) -> dict[str, float]:
    return dict(classify(chat_request(text)).predicted_accept)


def test_the_shipped_model_reads_these_features_in_this_order() -> None:
    assert json.loads(DEFAULT_PATH.read_text())["features"] == list(FEATURES)


def test_an_answer_from_a_provided_passage_is_predicted_for_ngram() -> None:
    extract = _predicted("Extract the answer to the question from the following context.\n"
                         f"Question: When was the lighthouse built?\nContext: {PASSAGE}")
    summary = _predicted(f"Summarize the following article.\n\n{PASSAGE}")
    poem = _predicted("Write a short poem about autumn leaves.")
    for grounded in (extract, summary):
        assert grounded["ngram"] > grounded["eagle"] + 0.8
        assert grounded["ngram"] > poem["ngram"] + 0.8


def test_json_output_is_predicted_for_eagle() -> None:
    json_ask = _predicted("Give me a JSON object with the names and ages of three fictional "
                          "characters.")
    assert json_ask["eagle"] > json_ask["ngram"]


def test_an_edit_of_provided_code_copies_more_than_writing_new_code() -> None:
    edit = _predicted("Fix the bug in this function:\n```python\ndef add(a, b):\n"
                      "    return a - b\n\nprint(add(1, 2))\n```")
    new = _predicted("Write a Python function that checks whether a number is prime.")
    assert edit["ngram"] > new["ngram"] + 0.5


def test_earlier_turns_count_as_material() -> None:
    one = parse_request({"model": "m", "messages": [{"role": "user", "content": "Go on."}]},
                        "chat")
    turns = parse_request({"model": "m", "messages": [
        {"role": "user", "content": PASSAGE}, {"role": "assistant", "content": "Noted."},
        {"role": "user", "content": "Go on."}]}, "chat")
    index = FEATURES.index("log_context_chars")
    assert request_vector(one)[1][index] == 0.0
    assert request_vector(turns)[1][index] > 5.0


def test_work_is_bounded_by_the_window() -> None:
    huge = "word " * 200_000  # 1 MB
    assert len(window(huge)) == HEAD_CHARS + 1 + TAIL_CHARS
    features = request_features("chat", huge, 0)
    assert len(features) == len(FEATURES)
    assert features[FEATURES.index("log_chars")] > 13.0  # the size is read whole


def test_an_unreadable_predictor_leaves_the_class_and_no_prediction(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(prediction, "_PREDICTOR", None)
    monkeypatch.setattr(prediction, "_FAILED", False)
    monkeypatch.setattr(predictor_module, "DEFAULT_PATH", tmp_path / "missing.json")
    profile = classify(chat_request(f"Summarize the following article.\n\n{PASSAGE}"))
    again = classify(chat_request("Write a short poem about autumn leaves."))
    assert profile.task == "edit" and again.task == "chat"
    assert profile.predicted_accept == () and profile.drafter_scales == ()
    assert profile.to_dict()["predicted"] == {"accept_length": {}, "scale": {}, "pooled_scale": {}}
    warnings = [r for r in caplog.records if "drafter predictor not loaded" in r.getMessage()]
    assert len(warnings) == 1  # tried once


def test_copy_features_of_a_code_edit() -> None:
    """The edit's material is code, its instruction names what the code holds, and an
    additive verb is told apart from a transforming one."""
    code = "def add_tax(total, rate):\n    total = total * (1 + rate)\n    return round(total, 2)\n"
    rename = request_vector(chat_request(f"Rename total to amount in add_tax.\n\n{code}"))[1]
    add = request_vector(chat_request(f"Add logging to the following function.\n\n{code}"))[1]
    prose = request_vector(chat_request("Write a poem about the sea and the wind."))[1]
    at = FEATURES.index
    assert rename[at("code_material")] == add[at("code_material")] == 1.0
    assert prose[at("code_material")] == 0.0 and prose[at("log_material")] == 0.0
    assert rename[at("named_share")] > add[at("named_share")]
    assert (rename[at("additive_edit")], add[at("additive_edit")]) == (0.0, 1.0)
    assert rename[at("log_material")] > 4.0
