"""A trivial upstream for the gateway benchmark: fixed answers, no model.

    python -m bench.gateway.upstream --port P

Speaks what every gateway in `specroute bench gateway` needs of a worker: SGLang's
`/generate`, the OpenAI `/v1/chat/completions` (streamed or not; the route sglang-router
and LiteLLM proxy forward to), and the probes sglang-router makes before it routes
(`/health`, `/server_info` (old name `/get_server_info`), `/model_info`, `/v1/models`).
Raw ASGI under uvicorn (uvloop + httptools), so the upstream itself costs as little as it
can and the benchmark measures the gateways, not the worker.
"""

from __future__ import annotations

import argparse

import orjson

MODEL = "bench"
_TEXT = " one two three four five six seven eight"
_META = {"id": "bench", "prompt_tokens": 4, "completion_tokens": 8, "e2e_latency": 0.0001,
         "finish_reason": {"type": "length", "length": 8}, "spec_verify_ct": 2,
         "spec_accept_length": 4.0, "spec_accept_rate": 0.75, "spec_num_correct_drafts": 6,
         "spec_num_proposed_drafts": 8}
_USAGE = {"prompt_tokens": 4, "completion_tokens": 8, "total_tokens": 12}
_SGLEXT = {"spec_tokens_details": {"spec_verify_ct": 2, "spec_accept_length": 4.0,
                                   "spec_accept_rate": 0.75, "spec_num_correct_drafts": 6,
                                   "spec_num_proposed_drafts": 8}}
_GENERATE = orjson.dumps({"text": _TEXT, "output_ids": [5, 6, 7, 8, 9, 10, 11, 12],
                          "meta_info": _META})
_GENERATE_STREAM = b"data: " + _GENERATE + b"\n\ndata: [DONE]\n\n"
_CHAT = orjson.dumps({
    "id": "chatcmpl-bench", "object": "chat.completion", "created": 1, "model": MODEL,
    "choices": [{"index": 0, "message": {"role": "assistant", "content": _TEXT},
                 "finish_reason": "length"}],
    "usage": _USAGE, "sglext": _SGLEXT})
_CHUNK = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1,
          "model": MODEL}
_CHAT_STREAM = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in (
    {**_CHUNK, "choices": [{"index": 0, "delta": {"role": "assistant", "content": _TEXT},
                            "finish_reason": None}]},
    {**_CHUNK, "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
    {**_CHUNK, "choices": [], "usage": _USAGE, "sglext": _SGLEXT},
)) + b"data: [DONE]\n\n"
_OK = orjson.dumps({"status": "ok"})
_MODELS = orjson.dumps({"object": "list", "data": [{"id": MODEL, "object": "model",
                                                     "created": 1, "owned_by": "bench"}]})
_SERVER_INFO = orjson.dumps({"model_path": MODEL, "served_model_name": MODEL,
                             "speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
                             "tp_size": 1, "dp_size": 1, "version": "bench",
                             "internal_states": [{"avg_spec_accept_length": 4.0}]})
_MODEL_INFO = orjson.dumps({"model_path": MODEL, "tokenizer_path": MODEL,
                            "is_generation": True, "served_model_name": MODEL})
_STATIC = {"/v1/models": _MODELS, "/server_info": _SERVER_INFO,
           "/get_server_info": _SERVER_INFO, "/model_info": _MODEL_INFO,
           "/get_model_info": _MODEL_INFO}
_ANSWERS = {"/generate": (_GENERATE, _GENERATE_STREAM),
            "/v1/chat/completions": (_CHAT, _CHAT_STREAM)}


async def read_body(receive) -> bytes:  # noqa: ANN001 - raw ASGI
    """The whole request body of a raw ASGI request."""
    chunks, more = [], True
    while more:
        message = await receive()
        chunks.append(message.get("body", b""))
        more = message.get("more_body", False)
    return b"".join(chunks)


async def app(scope, receive, send) -> None:
    if scope["type"] != "http":
        return
    path = scope["path"]
    content_type = b"application/json"
    if path in _ANSWERS:
        body = orjson.loads(await read_body(receive) or b"{}")
        stream = isinstance(body, dict) and bool(body.get("stream"))
        payload = _ANSWERS[path][stream]
        if stream:
            content_type = b"text/event-stream"
    else:
        payload = _STATIC.get(path, _OK)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", content_type),
                            (b"content-length", str(len(payload)).encode())]})
    await send({"type": "http.response.body", "body": payload})


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args(argv)
    uvicorn.run(app, host="127.0.0.1", port=args.port, loop="uvloop", http="httptools",
                log_level="warning", access_log=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
