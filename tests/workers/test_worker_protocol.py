"""Parsing (`requests`) and response shapes (`responses`) of the worker's SGLang surface,
without a model."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import pytest

from policies.fleet import WORKER_BATCH_KEY
from policies.request_limits import JSON_OBJECT_SCHEMA
from workers.embedded import introspection, parsing, responses, tools
from workers.embedded.api import Constraint
from workers.embedded.errors import BadRequest


@dataclass
class Stats:
    prompt_tokens: int = 7
    completion_tokens: int = 12
    verify_steps: int = 4
    num_proposed_drafts: int = 16
    num_correct_drafts: int = 8
    batch_steps: int = 3
    mean_batch: float | None = 2.5
    mean_batch_draft_tokens: float | None = 4.0
    first_token_at: float | None = 0.5
    by_source: dict = field(default_factory=dict)  # one drafter: no branches
    # decode steps by drafts accepted: 3 steps after the prefill's, 8 drafts accepted
    accept_histogram: list = field(default_factory=lambda: [0, 0, 1, 0, 0, 0, 1])


@dataclass
class Out:
    token_ids: list[int]
    text: str
    finished: bool
    finish_reason: str | None
    matched_stop: str | int | None = None


def test_generate_body_maps_sglang_names_to_the_engine() -> None:
    req = parsing.parse_generate({
        "text": "hi", "stream": True, "rid": "r1",
        "sampling_params": {"max_new_tokens": 9, "temperature": 0, "top_p": 0.5, "top_k": -1,
                            "stop": "\n", "stop_token_ids": [2], "ignore_eos": True,
                            "sampling_seed": 3,
                            "custom_params": {"num_speculative_tokens": 5, "method": "eagle"}},
    })
    assert (req.text, req.input_ids, req.stream, req.rid) == ("hi", None, True, "r1")
    assert (req.method, req.k) == ("eagle", 5)
    s = req.sampling
    assert (s.max_new_tokens, s.temperature, s.top_p, s.top_k) == (9, 0.0, 0.5, 0)
    assert (s.stop, s.stop_token_ids, s.ignore_eos, s.seed) == (["\n"], [2], True, 3)


def test_sglang_defaults_apply_when_fields_are_missing() -> None:
    req = parsing.parse_generate({"input_ids": [5, 6]})
    assert req.input_ids == [5, 6] and req.sampling.max_new_tokens == 128
    assert req.sampling.temperature == 1.0  # SGLang's default, not greedy
    assert parsing.parse_chat({"messages": [{"role": "user", "content": "x"}]},
                               lambda m: [5]).sampling.max_new_tokens is None
    assert parsing.parse_completion({"prompt": "x"}).sampling.max_new_tokens == 16


@pytest.mark.parametrize("body, message", [
    ({}, "either text or input_ids"),
    ({"text": ""}, "text is empty"),
    ({"text": "a", "input_ids": [1]}, "not both"),
    ({"text": ["a", "b"]}, "batch requests are not supported"),
    ({"input_ids": [[1], [2]]}, "batch requests are not supported"),
    ({"input_ids": ["a"]}, "list of integers"),
    ({"text": "a", "sampling_params": {"max_new_tokens": 0}}, "max_new_tokens must be >= 1"),
    ({"text": "a", "sampling_params": {"max_new_tokens": "9"}}, "must be of type int"),
    ({"text": "a", "sampling_params": {"temperature": -1}}, "temperature must be >= 0"),
    ({"text": "a", "sampling_params": {"top_p": 0}}, "top_p"),
    ({"text": "a", "sampling_params": {"json_schema": "{}", "regex": "a"}}, "only one of"),
    ({"text": "a", "sampling_params": {"regex": 5}}, "regex must be a non-empty string"),
    ({"text": "a", "sampling_params": {"structural_tag": "{}"}}, "structural_tag is not"),
    ({"text": "a", "sampling_params": {"logit_bias": {"x": 1}}}, "logit_bias must map"),
    ({"text": "a", "sampling_params": {"logit_bias": {"3": 500}}}, "logit_bias must map"),
    ({"text": "a", "logprob_start_len": 0}, "prompt logprobs are not"),
    ({"text": "a", "sampling_params": {"custom_params": {"num_speculative_tokens": -1}}},
     "num_speculative_tokens must be >= 0"),
    ({"text": "a", "sampling_params": {"custom_params": {"num_speculative_tokens": 2.5}}},
     "must be of type int"),
    ({"text": "a", "sampling_params": {"n": 2}}, "n must be 1"),
    ({"text": "a", "sampling_params": {"min_p": 0.5}}, "not supported"),
    ({"text": "a", "sampling_params": []}, "batch requests"),
])
def test_bad_generate_bodies_are_400_with_a_message(body: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message.replace("(", r"\(").replace("+", r"\+")):
        parsing.parse_generate(body)


def test_malformed_json_and_non_objects_are_bad_requests() -> None:
    with pytest.raises(BadRequest, match="malformed JSON"):
        parsing.parse_json(b"{nope")
    with pytest.raises(BadRequest, match="JSON object"):
        parsing.parse_json(b"[1, 2]")


def test_generate_constraints_penalties_and_logprobs_reach_the_engine() -> None:
    req = parsing.parse_generate({
        "text": "a", "return_logprob": True, "top_logprobs_num": 2,
        "sampling_params": {"regex": "[0-9]+", "presence_penalty": 0.5,
                            "frequency_penalty": -0.5, "logit_bias": {"7": -100}}})
    s = req.sampling
    assert s.constraint == Constraint("regex", "[0-9]+") and s.top_logprobs == 2
    assert (s.presence_penalty, s.frequency_penalty, s.logit_bias) == (0.5, -0.5, {7: -100.0})
    assert parsing.parse_generate({"text": "a", "top_logprobs_num": 2}).sampling.top_logprobs \
        is None  # without return_logprob


def test_openai_response_format_logprobs_and_n() -> None:
    chat = {"messages": [{"role": "user", "content": "x"}]}
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    req = parsing.parse_chat({**chat, "n": 3, "logprobs": True, "top_logprobs": 4,
                               "response_format": {"type": "json_schema", "json_schema": {
                                   "name": "x", "schema": schema, "strict": True}}},
                              lambda m: [5])
    assert req.n == 3 and req.sampling.top_logprobs == 4
    assert req.sampling.constraint == Constraint("json_schema", json.dumps(schema,
                                                                           separators=(",", ":")))
    req = parsing.parse_chat({**chat, "response_format": {"type": "json_object"}}, lambda m: [5])
    assert req.sampling.constraint == Constraint("json_schema", JSON_OBJECT_SCHEMA)
    assert parsing.parse_completion({"prompt": "x", "logprobs": 2}).sampling.top_logprobs == 2
    with pytest.raises(BadRequest, match="n must be in"):
        parsing.parse_chat({**chat, "n": 0}, lambda m: [5])
    with pytest.raises(BadRequest, match="top_logprobs needs logprobs"):
        parsing.parse_chat({**chat, "top_logprobs": 2}, lambda m: [5])
    with pytest.raises(BadRequest, match="either response_format"):
        parsing.parse_chat({**chat, "response_format": {"type": "json_object"}, "regex": "a"},
                            lambda m: [5])


TOOL = {"type": "function", "function": {"name": "f", "parameters": {
    "type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}}}


def test_tools_become_a_prompt_and_a_grammar() -> None:
    seen: list = []
    chat = {"messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "x"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c1", "type": "function",
                              "function": {"name": "f", "arguments": '{"x": 1}'}}]},
                         {"role": "tool", "tool_call_id": "c1", "content": "2"}],
            "tools": [TOOL]}
    req = parsing.parse_chat({**chat, "tool_choice": "required"},
                              lambda m: seen.append(m) or [5])
    assert req.tool_mode == "forced" and req.sampling.constraint is not None
    assert req.sampling.constraint.kind == "lark" and "start: call" in req.sampling.constraint.text
    system, user, assistant, result = seen[0]
    assert system["content"].startswith("Be brief.") and '"name": "f"' in system["content"]
    assert assistant["content"] == '<tool_call>{"name": "f", "arguments": {"x": 1}}</tool_call>'
    assert result == {"role": "user", "content": "<tool_response>\n2\n</tool_response>"}
    auto = parsing.parse_chat(chat, lambda m: [5])
    assert auto.tool_mode == "auto" and "free" in auto.sampling.constraint.text  # type: ignore
    none = parsing.parse_chat({**chat, "tool_choice": "none"}, lambda m: [5])
    assert none.tool_mode is None and none.sampling.constraint is None
    assert tools.parse_call('<tool_call>{"name": "f", "arguments": {"x": 3}}</tool_call>')[
        0]["function"] == {"name": "f", "arguments": '{"x": 3}'}  # type: ignore[index]
    assert tools.parse_call("hello") is None


@pytest.mark.parametrize("extra, message", [
    ({"tools": [{"type": "function"}]}, "tools\\[0\\]"),
    ({"tools": [TOOL, TOOL]}, "unique"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": {"name": "g"}}},
     "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice needs tools"),
    ({"tools": [TOOL], "tool_choice": {"type": "function", "function": "f"}}, "tool_choice"),
    ({"tools": [TOOL], "tool_choice": 5}, "tool_choice"),
    ({"tools": [TOOL], "response_format": {"type": "json_object"}}, "cannot be combined"),
])
def test_bad_tools_are_400(extra: dict, message: str) -> None:
    with pytest.raises(BadRequest, match=message):
        parsing.parse_chat({"messages": [{"role": "user", "content": "x"}], **extra},
                            lambda m: [5])
    with pytest.raises(BadRequest, match="max_tokens must be >= 1"):
        parsing.parse_completion({"prompt": "x", "max_tokens": 0})


def test_meta_info_adds_latency_and_spec_fields_only_at_the_end() -> None:
    running = responses.meta_info("r", Out([1], "a", False, None), Stats(), 0.0, True)
    assert running["finish_reason"] is None
    assert "e2e_latency" not in running and "spec_verify_ct" not in running
    final = responses.meta_info("r", Out([1], "a", True, "stop", "\n"), Stats(), 0.0, True)
    assert final["finish_reason"] == {"type": "stop", "matched": "\n"}
    assert final["spec_accept_length"] == 12 / 4  # completion_tokens / spec_verify_ct
    assert final["spec_accept_rate"] == 8 / 16
    assert final["spec_correct_drafts_histogram"] == [0, 0, 1, 0, 0, 0, 1]
    plain = responses.meta_info("r", Out([1], "a", True, "length"), Stats(), 0.0, False)
    assert plain["finish_reason"] == {"type": "length", "length": 12}
    assert "spec_verify_ct" not in plain


def test_every_final_meta_info_says_its_batch_and_samples_merge_by_steps() -> None:
    started = time.perf_counter()
    stats = Stats(first_token_at=started + 0.25)
    plain = responses.meta_info("r", Out([1], "a", True, "length"), stats, started, False)
    decode = plain[WORKER_BATCH_KEY].pop("decode_s")
    assert plain[WORKER_BATCH_KEY] == {"requests": 2.5, "draft_tokens": 4.0, "steps": 3}
    # from the first token to the end: the whole less the 0.25 s before the first token
    assert decode == pytest.approx(plain["e2e_latency"] - 0.25, abs=1e-3)
    running = responses.meta_info("r", Out([1], "a", False, None), Stats(), 0.0, False)
    assert WORKER_BATCH_KEY not in running
    first_only = Stats(batch_steps=0, mean_batch=None, mean_batch_draft_tokens=None)
    assert responses.batch_fields(first_only, 2.0) == {  # type: ignore[arg-type]
        "requests": None, "draft_tokens": None, "steps": 0, "decode_s": 1.5}
    merged = responses.merge_batch([
        {"requests": 2.0, "draft_tokens": 3.0, "steps": 1, "decode_s": 0.5},
        {"requests": 1.0, "draft_tokens": 0.0, "steps": 3, "decode_s": 0.75},
        {"requests": None, "draft_tokens": None, "steps": 0, "decode_s": None}])
    assert merged == {"requests": 5 / 4, "draft_tokens": 3 / 4, "steps": 4, "decode_s": 0.75}
    assert responses.merge_batch([responses.batch_fields(first_only, 2.0)])[  # type: ignore[arg-type]
        "requests"] is None


def test_key_names_match_sglang_0_5_23() -> None:
    """Names read from the sglang==0.5.23 wheel (paths under sglang/srt/)."""
    final = responses.meta_info("r", Out([1], "a", True, "length"), Stats(), 0.0, True)
    # managers/tokenizer_manager.py: _handle_batch_output (meta_info = {...}, ~L2507-2557,
    # e2e_latency ~L2753) and _calculate_spec_decoding_metrics (~L3138-3172)
    sglang_meta = {"id", "finish_reason", "prompt_tokens", "weight_version", "num_retractions",
                   "reasoning_tokens", "completion_tokens", "cached_tokens", "e2e_latency",
                   "spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts",
                   "spec_num_proposed_drafts", "spec_verify_ct"}
    # ours, the one addition, and the per-request accept histogram SGLang's later
    # managers/io_struct.py carries (BatchStrOutput.spec_correct_drafts_histogram) and
    # 0.5.23 already names in SpecTokensDetails (below)
    assert set(final) == sglang_meta | {WORKER_BATCH_KEY, "spec_correct_drafts_histogram"}
    # entrypoints/openai/protocol.py: class SpecTokensDetails (~L456)
    details = responses.spec_tokens_details(final)
    assert details is not None and set(details) == {
        "spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length",
        "spec_num_correct_drafts", "spec_num_proposed_drafts", "spec_verify_ct",
        "spec_correct_drafts_histogram", "spec_cap_lens_histogram"}
    # entrypoints/openai/protocol.py: class UsageInfo (~L221)
    assert {"prompt_tokens", "total_tokens", "completion_tokens"} <= set(responses.usage(1, 2))
    # entrypoints/openai/protocol.py: class ErrorResponse (~L106)
    assert set(responses.error_body("m", 400)) == {"object", "message", "type", "param", "code"}
    # arg_groups/fields/spec.py: speculative_* server args; builtin algorithm names
    assert {"NGRAM", "EAGLE", "STANDALONE"} <= set(introspection.SGLANG_ALGORITHM.values())
    # sampling/sampling_params.py: SamplingParams (~L140); TOP_K_ALL = 1 << 30
    assert parsing.parse_generate({"text": "a", "sampling_params": {
        "sampling_seed": 1, "top_k": 1 << 30}}).sampling.seed == 1
