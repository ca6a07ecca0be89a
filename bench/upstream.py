"""A trivial SGLang-shaped upstream for the gateway benchmark: fixed answers, no model.

    python -m bench.upstream --port P

Raw ASGI under uvicorn (uvloop + httptools), so the upstream itself costs as little as it
can and the benchmark measures the gateway, not the worker.
"""

from __future__ import annotations

import argparse

import orjson

_META = {"id": "bench", "prompt_tokens": 4, "completion_tokens": 8, "e2e_latency": 0.0001,
         "finish_reason": {"type": "length", "length": 8}, "spec_verify_ct": 2,
         "spec_accept_length": 4.0, "spec_accept_rate": 0.75, "spec_num_correct_drafts": 6,
         "spec_num_proposed_drafts": 8}
_GENERATE = orjson.dumps({"text": " one two three four five six seven eight",
                          "output_ids": [5, 6, 7, 8, 9, 10, 11, 12], "meta_info": _META})
_STREAM = (b"data: " + _GENERATE + b"\n\ndata: [DONE]\n\n")
_OK = orjson.dumps({"status": "ok"})
_MODELS = orjson.dumps({"object": "list", "data": [{"id": "bench", "object": "model"}]})
_SERVER_INFO = orjson.dumps({"speculative_algorithm": "EAGLE", "speculative_num_steps": 3,
                             "internal_states": [{"avg_spec_accept_length": 4.0}]})


async def _body(receive) -> bytes:
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
    if path == "/generate":
        body = await _body(receive)
        stream = orjson.loads(body or b"{}").get("stream", False)
        payload = _STREAM if stream else _GENERATE
        if stream:
            content_type = b"text/event-stream"
    elif path == "/v1/models":
        payload = _MODELS
    elif path in ("/server_info", "/get_server_info"):
        payload = _SERVER_INFO
    else:
        payload = _OK
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
