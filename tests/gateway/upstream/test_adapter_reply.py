"""Every malformed reply shape (tests/stub_shapes.py) read at the adapter boundary is one
`UpstreamProtocolError` (retryable, counted against the worker), never a TypeError; the
well-formed answers around them still read as before."""

from __future__ import annotations

import pytest
from stub_shapes import SHAPES, generate_reply, openai_reply

from gateway.errors import UpstreamProtocolError, UpstreamUnavailable
from gateway.upstream.adapters.openai_body import deltas_from_chunk, result_from_body
from gateway.upstream.adapters.reply import Reply
from gateway.upstream.adapters.sglang import result_from_generate, spec_from_meta

W = "http://w"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("chat", [True, False], ids=["chat", "completions"])
def test_openai_shapes_are_protocol_errors(shape: str, chat: bool) -> None:
    with pytest.raises(UpstreamProtocolError) as caught:
        result_from_body(W, openai_reply(shape, chat, stream=False), chat)
    assert isinstance(caught.value, UpstreamUnavailable)  # the dispatcher retries it
    assert caught.value.code == "upstream_protocol_error" and W in caught.value.message


@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "no-choices"])
def test_openai_stream_events_are_protocol_errors(shape: str) -> None:
    """(A stream without choices is caught at its end: no finish_reason.)"""
    with pytest.raises(UpstreamProtocolError):
        chunk = Reply(W, openai_reply(shape, True, stream=True), "event")
        deltas_from_chunk(chunk, chat=True)
        Reply(W, chunk.get("usage") or {}, "usage").count("completion_tokens")


@pytest.mark.parametrize("shape", SHAPES)
def test_generate_shapes_are_protocol_errors(shape: str) -> None:
    with pytest.raises(UpstreamProtocolError):
        result_from_generate(W, generate_reply(shape, stream=False), native=False)


def test_well_formed_answers_read_as_before() -> None:
    body = {"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi",
                                                 "tool_calls": None},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 3, "completion_tokens": 2.0},
            "sglext": {"spec_tokens_details": [{"spec_verify_ct": 1,
                                                "spec_accept_length": 2}]}}
    result = result_from_body(W, body, chat=True)
    assert (result.text, result.finish_reason) == ("hi", "length")
    assert (result.usage.prompt_tokens, result.usage.completion_tokens) == (3, 2)
    assert (result.spec.verify_steps, result.spec.accept_length) == (1, 2.0)
    native = result_from_generate(W, {"text": "x", "meta_info": {
        "completion_tokens": 1, "finish_reason": {"type": "stop"}}}, native=True)
    assert native.finish_reason == "stop" and native.native is not None
    assert spec_from_meta({"spec_accept_rate": None}).accept_rate is None


def test_the_error_names_the_field_by_its_path_in_the_reply() -> None:
    """Paths are spelled out only for an error (a well-formed reply builds none)."""
    cases = [({"choices": [{"message": 5}]}, "body.choices[0].message is int"),
             ({"choices": [{"message": {}}, {"message": {"content": [1]}}]},
              "body.choices[1].message.content is list, not a string"),
             ({"choices": [{"message": {}}], "usage": {"prompt_tokens": -1}},
              "body.usage.prompt_tokens is int, not a non-negative whole number"),
             ({"choices": [{"message": {}}], "metrics": {"speculative_decoding": {
                 "num_spec_steps": 1.5}}},
              "body.metrics.speculative_decoding.num_spec_steps is float")]
    for body, message in cases:
        with pytest.raises(UpstreamProtocolError) as caught:
            result_from_body(W, body, chat=True)
        assert message in caught.value.message
