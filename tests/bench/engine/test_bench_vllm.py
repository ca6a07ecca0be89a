"""`specroute bench vllm`'s arithmetic: the paired ratio and its interval, and the report's
met / missed verdicts, on known rows (the run itself needs the vLLM stack)."""

from __future__ import annotations

import json
import random

import pytest

from bench.engine.vllm import TASKS, paired_ratio, report


def test_paired_ratio_and_its_interval() -> None:
    ratio, low, high = paired_ratio([20.0, 22.0, 18.0, 20.0], [10.0, 11.0, 9.0, 10.0],
                                    random.Random(0))
    assert ratio == pytest.approx(2.0) and low == pytest.approx(2.0) \
        and high == pytest.approx(2.0)  # the same ratio on every prompt: no spread
    ratio, low, high = paired_ratio([30.0, 10.0, 20.0], [10.0, 10.0, 10.0], random.Random(0))
    assert ratio == pytest.approx(2.0) and low < 2.0 < high


def test_report_says_met_or_missed(capsys: pytest.CaptureFixture[str]) -> None:
    def row(tps: float, accept: float) -> dict:
        return {"tokens_per_s": tps, "accept_length": accept}

    rows = {(task, pool): [row(tps, accept)] * 2 for task in TASKS
            for pool, tps, accept in (("vllm-plain", 10.0, 1.0), ("vllm-ngram", 19.0, 3.0))}
    learned = {"edit/vllm-ngram": {"predicted": 3.3, "observed": 3.0, "requests": 50,
                                   "chosen": "vllm-ngram"},
               "chat/vllm-ngram": {"predicted": 3.1, "observed": 1.3, "requests": 50,
                                   "chosen": "vllm-plain"},
               "chat/vllm-plain": {"predicted": 1.0, "observed": None, "requests": 0,
                                   "chosen": "vllm-plain"}}
    result = report(rows, learned, random.Random(0))
    out = capsys.readouterr().out
    assert result["pinned"]["edit"]["vllm-ngram"]["over_plain"] == pytest.approx(1.9)
    assert "vllm-ngram / plain on edit at c = 1: 1.90 (target >= 1.8: met)" in out
    assert [learned[k]["within_20pct"] for k in learned] == [True, False, None]


def test_mixed_traffic_counts_every_malformed_or_failed_reply(
        capsys: pytest.CaptureFixture[str]) -> None:
    """Chat, streamed chat, completions and JSON mode in turn; a JSON-mode reply that is a
    500 and a stream that never ends with [DONE] are errors, the rest are not."""
    import httpx

    from bench.engine.vllm import mixed

    def handler(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        if request.url.path == "/v1/completions":
            return httpx.Response(200, json={"choices": [{"text": "Paris"}]})
        if body.get("stream"):
            data = 'data: {"choices": []}\n\ndata: {"choices": []}\n\n'
            done = "data: [DONE]\n\n" if body["messages"][0]["content"] != "cut" else ""
            return httpx.Response(200, text=data + done)
        if body.get("response_format"):
            return httpx.Response(500, json={"error": {"message": "boom"}})
        return httpx.Response(200, json={"choices": [{"message": {"content": "hi"}}]})

    item = {"model": "m", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    cut = {**item, "messages": [{"role": "user", "content": "cut"}]}
    items = {"edit": [item], "code": [cut], "chat": [item]}
    with httpx.Client(transport=httpx.MockTransport(handler), base_url="http://t") as client:
        result = mixed(client, items, 12)
    # kinds cycle chat/stream/completion/json; bodies cycle item/cut/item
    assert result == {"requests": 12, "errors": 4,
                      "first_errors": ["stream: 200", "json: 500", "json: 500", "json: 500"]}
    assert "12 requests, 4 errors (target 0: missed)" in capsys.readouterr().out


def test_engine_compare_arithmetic(capsys: pytest.CaptureFixture[str]) -> None:
    from bench.engine.compare import accept_length, core_count, entry
    from bench.engine.compare import report as compare_report

    assert (core_count("0"), core_count("0-1"), core_count("0,2-3")) == (1, 2, 3)
    assert (entry("eagle"), entry("eagle:2"), entry("plain")) == (("eagle", 3), ("eagle", 2),
                                                                  ("plain", 0))
    assert accept_length({"metrics": {"speculative_decoding": {
        "mean_acceptance_length": 2.5}}}) == 2.5  # vLLM, --per-request-spec-decode-metrics
    assert accept_length({"sglext": {"spec_tokens_details": {"spec_accept_length": 1.5}}}) \
        == 1.5  # the embedded engine (SGLang's sglext)
    assert accept_length({"choices": []}) is None
    cell = {"c1": 10.0, "c4": 20.0, "accept": None}
    results = {"embedded/plain": {t: cell for t in TASKS},
               "vllm/plain": {t: {**cell, "c1": 20.0, "c4": 80.0} for t in TASKS},
               "embedded/ngram": {t: {**cell, "accept": 2.0} for t in TASKS},
               "vllm/ngram": {t: {**cell, "c1": 40.0, "c4": 80.0, "accept": 3.0} for t in TASKS}}
    summary = compare_report(results, ["plain", "ngram"])
    assert summary["embedded_over_vllm"] == {"plain": {"c1": 0.5, "c4": 0.25},
                                             "ngram": {"c1": 0.25, "c4": 0.25}}
    assert summary["vllm_speedup_over_plain"]["ngram"] == {t: 2.0 for t in TASKS}
    assert summary["speedup_over_plain"]["ngram"] == {t: 1.0 for t in TASKS}  # embedded
    assert summary["accept_length"] == {"plain": {t: None for t in TASKS},
                                        "ngram": {t: 2.0 for t in TASKS}}
    assert summary["k"] == {"plain": 0, "ngram": 4}
    printed = capsys.readouterr().out
    assert "| ngram | edit | 10.0 | 40.0 | 0.25 |" in printed
    assert "| embedded plain >= 1.0x vLLM CPU eager tokens/s at c = 1 | 0.50x | missed |" in printed
    assert "| best speculation >= 1.5x plain on code at T0 | 1.00x (ngram) | missed |" in printed
    assert "| EAGLE accept length >= 2.5 on code at T0, best k | - | not measured |" in printed


def test_engine_compare_targets_take_the_best_method_and_k() -> None:
    from bench.engine.compare import targets

    summary = {"embedded_over_vllm": {"plain": {"c1": 1.55, "c4": 1.1}},
               "k": {"plain": 0, "eagle:1": 1, "eagle:2": 2, "medusa:2": 2},
               "speedup_over_plain": {"eagle:1": {"code": 1.2, "chat": 1.31},
                                      "eagle:2": {"code": 1.6, "chat": 0.9},
                                      "medusa:2": {"code": 1.1, "chat": 1.0}},
               "accept_length": {"plain": {"code": None, "chat": None},
                                 "eagle:1": {"code": 1.8, "chat": 1.5},
                                 "eagle:2": {"code": 2.6, "chat": 1.4},
                                 "medusa:2": {"code": 2.9, "chat": 2.9}}}
    rows = {r["target"]: (r["figure"], r["met"]) for r in targets(summary)}
    assert rows == {
        "embedded plain >= 1.0x vLLM CPU eager tokens/s at c = 1": ("1.55x", True),
        "best speculation >= 1.5x plain on code at T0": ("1.60x (eagle:2)", True),
        "best speculation >= 1.3x plain on chat at T0": ("1.31x (eagle:1)", True),
        "EAGLE accept length >= 2.5 on code at T0, best k": ("2.60 (eagle:2)", True),
        "EAGLE accept length >= 2.5 on chat at T0, best k": ("1.50 (eagle:1)", False)}


def test_the_pinned_figures_written_as_measured_json_read_back_the_same(tmp_path) -> None:
    """What `--write-measured` writes is what the fleet planner's builder reads: per
    (method, k) and class the accept length vLLM reported, and the step at one request
    (accept length / tokens/s; plain: 1 / tokens/s); no costs per batch size."""
    from bench.engine.measured import measured_document, write_measured
    from bench.engine.vllm import measured_rows
    from policies.planner.benchmarked import benchmarked_from_measured
    from policies.prior import Measured, read_measured

    def asked(tps: float, accept: float | None) -> dict:
        return {"tokens_per_s": tps, "accept_length": accept}

    rows = {("edit", "vllm-plain"): [asked(10.0, None), asked(12.0, None)],
            ("edit", "vllm-ngram"): [asked(20.0, 3.0), asked(24.0, 2.0)],
            ("code", "vllm-plain"): [asked(10.0, 1.0)], ("code", "vllm-ngram"): [asked(12.0, 1.5)],
            ("chat", "vllm-plain"): [asked(10.0, 1.0)], ("chat", "vllm-eagle"): [asked(9.0, None)]}
    configs = {"vllm-plain": ("plain", 0), "vllm-ngram": ("ngram", 4), "vllm-eagle": ("eagle", 3)}
    entries = measured_rows(rows, configs)
    # eagle reported no accept length: no entry (nothing says what it accepts)
    assert {(e["method"], e["task"]) for e in entries} == {
        ("plain", "edit"), ("ngram", "edit"), ("plain", "code"), ("ngram", "code"),
        ("plain", "chat")}
    path = tmp_path / "cache" / "vllm-m.json"
    write_measured(path, measured_document("m", "specroute bench vllm", "cpu: test", entries))
    bench = {(b.method, b.k): b for b in benchmarked_from_measured(
        [Measured.from_dict(read_measured(path))])}
    assert set(bench) == {("plain", 0), ("ngram", 4)}
    ngram, plain = bench[("ngram", 4)], bench[("plain", 0)]
    assert ngram.accept_length == {("edit", "t0"): pytest.approx(2.5),
                                   ("code", "t0"): pytest.approx(1.5)}
    assert ngram.batches == (1,) and plain.batches == (1,)
    # the step: accept length / tokens/s, mean over classes weighted by requests
    assert ngram.step_at(1) == pytest.approx((2 * 2.5 / 22.0 + 1.5 / 12.0) / 3)
    assert plain.step_at(1) == pytest.approx((2 / 11.0 + 1 / 10.0 + 1 / 10.0) / 4)
    edit = next(e for e in entries if (e["method"], e["task"]) == ("ngram", "edit"))
    assert edit["speedup"] == pytest.approx(2.0) and edit["requests"] == 2


def test_a_document_off_the_schema_is_not_written(tmp_path) -> None:
    from bench.engine.measured import write_measured
    from policies.prior import MeasuredError

    path = tmp_path / "measured.json"
    with pytest.raises(MeasuredError, match="accept_length"):
        write_measured(path, {"model": "m", "source": "s", "measured_at": "d", "device": "c",
                              "entries": [{"method": "ngram", "k": 4, "task": "edit",
                                           "temperature": 0.0, "accept_length": 0.5,
                                           "tokens_per_s": 1.0, "speedup": 1.0,
                                           "requests": 1}]})
    assert not path.exists()
