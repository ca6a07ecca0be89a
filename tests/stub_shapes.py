"""Malformed replies for the stub workers (`tests/sglang_stub.py --fault SHAPE`): well-formed
JSON of the wrong shape, status 200, in each route's form (SGLang's `/generate`, the
OpenAI chat and completions routes, streamed or not, and `/server_info`).

A streamed reply carries its fault in the FIRST event, so that a gateway that reads it
at its boundary can still retry another worker before any token reached the client.

- `counters-as-strings`: usage and speculation counters as strings;
- `lists-for-objects`: a list where an object belongs (a choice, `meta_info`, `usage`);
- `no-choices`: no `choices` (OpenAI) / no `text` (`/generate`); a stream of events
  without any choice or finish reason;
- `bad-stream-choices`: choices that are not objects, a message that is a string,
  `text` that is a number;
- `bad-usage`: negative and fractional token counts, `usage` a string.
"""

from __future__ import annotations

from typing import Any

SHAPES = ("counters-as-strings", "lists-for-objects", "no-choices", "bad-stream-choices",
          "bad-usage")

USAGE = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
META = {"id": "x", "prompt_tokens": 1, "completion_tokens": 1,
        "finish_reason": {"type": "stop", "matched": None}}


def _choice(chat: bool, stream: bool) -> dict[str, Any]:
    if not chat:
        return {"index": 0, "text": "ok", "finish_reason": "stop"}
    key = "delta" if stream else "message"
    return {"index": 0, key: {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}


def openai_reply(shape: str, chat: bool, stream: bool) -> dict[str, Any]:
    """The whole answer (not streaming) or the first event (streaming) of an OpenAI route."""
    head: dict[str, Any] = {"id": "x", "object": ("chat.completion" if chat
                                                  else "text_completion")
                            + (".chunk" if chat and stream else ""), "model": "m"}
    good = _choice(chat, stream)
    if shape == "counters-as-strings":
        return {**head, "choices": [good],
                "usage": {"prompt_tokens": "1", "completion_tokens": "one"},
                "sglext": {"spec_tokens_details": {"spec_verify_ct": "three",
                                                   "spec_accept_length": "long"}}}
    if shape == "lists-for-objects":
        return {**head, "choices": [[good]], "usage": [1, 1]}
    if shape == "no-choices":
        return {**head, "usage": USAGE} if not stream else head
    if shape == "bad-stream-choices":
        if stream:
            return {**head, "choices": ["ok", 5]}
        return {**head, "choices": [{"index": 0, "message": "ok", "finish_reason": "stop"}
                                    if chat else {"index": 0, "text": 5}], "usage": USAGE}
    assert shape == "bad-usage", shape
    usage: Any = "lots" if stream else {"prompt_tokens": -3, "completion_tokens": 2.5}
    return {**head, "choices": [good], "usage": usage}


def generate_reply(shape: str, stream: bool) -> dict[str, Any]:
    """The answer, or the first streamed chunk, of SGLang's `/generate`."""
    if shape == "counters-as-strings":
        return {"text": "ok", "output_ids": [100], "meta_info": {
            **META, "completion_tokens": "one", "spec_verify_ct": "3"}}
    if shape == "lists-for-objects":
        return {"text": "ok", "output_ids": [100], "meta_info": [META]}
    if shape == "no-choices":
        return {"output_ids": [100], "meta_info": META}
    if shape == "bad-stream-choices":
        return {"text": 5 if stream else ["ok"], "output_ids": "x", "meta_info": META}
    assert shape == "bad-usage", shape
    return {"text": "ok", "output_ids": [100],
            "meta_info": {**META, "prompt_tokens": -1, "completion_tokens": 2.5}}


def server_info(shape: str) -> Any:
    """`/server_info` of the wrong shape, one per fault."""
    return {"counters-as-strings": {"internal_states": [{"num_running_reqs": "many",
                                                        "avg_spec_accept_length": "x"}]},
            "lists-for-objects": {"internal_states": [[1]], "speculative_num_steps": [3]},
            "no-choices": [],
            "bad-stream-choices": {"internal_states": "x"},
            "bad-usage": {"internal_states": 5}}[shape]
