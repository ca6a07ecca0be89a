"""A worker that misbehaves on cue, for the gateway's timeout and fault tests: a real
aiohttp server on 127.0.0.1 shaped like SGLang's `/generate` and the OpenAI chat route.

The prompt (completions `text`, or the last chat message) picks the behaviour:
STALL_HEAD never answers; STALL_FIRST starts an SSE stream and sends only comments (no
token, yet never silent); STALL_MID sends one token, then nothing; TRICKLE sends a token
every 0.3 s forever; GARBAGE_FIRST / GARBAGE_MID send an event whose `choices` entry is
not an object, before / after a first token; BUG_FIRST / BUG_MID send a well-formed event
marked `"bug": true`, which the fault test's gateway trips over on purpose (its adapter
is wrapped to raise: a stand-in for a bug); anything else gets a normal answer. `GET /stats`: `open_streams`, the streams whose
client (the gateway) has not gone yet: a stream the gateway cut must come back to 0.

    python tests/stall_stub.py --port P
"""

from __future__ import annotations

import argparse
import asyncio

import orjson
from aiohttp import web

FOREVER = 3600.0
OPEN = {"streams": 0}
META = {"prompt_tokens": 1, "completion_tokens": 1, "finish_reason": {"type": "stop"}}


def event(body: dict) -> bytes:
    return b"data: " + orjson.dumps(body) + b"\n\n"


async def behave(request: web.Request, prompt: str, token: bytes, garbage: bytes
                 ) -> web.StreamResponse:
    if "STALL_HEAD" in prompt:
        await asyncio.sleep(FOREVER)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    OPEN["streams"] += 1
    try:
        return await misbehave(response, prompt, token, garbage)
    finally:
        OPEN["streams"] -= 1


async def misbehave(response: web.StreamResponse, prompt: str, token: bytes,
                    garbage: bytes) -> web.StreamResponse:
    if "STALL_FIRST" in prompt:
        while True:
            await response.write(b": still here\n\n")
            await asyncio.sleep(0.3)
    bug = event({"bug": True, "choices": []})
    if "GARBAGE_FIRST" in prompt or "BUG_FIRST" in prompt:
        await response.write(garbage if "GARBAGE" in prompt else bug)
        await asyncio.sleep(FOREVER)
    await response.write(token)
    if "GARBAGE_MID" in prompt or "BUG_MID" in prompt:
        await response.write(garbage if "GARBAGE" in prompt else bug)
    if "STALL_MID" in prompt or "GARBAGE_MID" in prompt or "BUG_MID" in prompt:
        await asyncio.sleep(FOREVER)
    if "TRICKLE" in prompt:
        while True:
            await asyncio.sleep(0.3)
            await response.write(token)
    await response.write(b"data: [DONE]\n\n")
    return response


async def generate(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = body.get("text") or ""
    if not body.get("stream") and "STALL" not in prompt:
        return web.json_response({"text": "ok", "meta_info": META})
    return await behave(request, prompt, event({"text": "ok", "meta_info": META}),
                        event({"text": ["not", "text"]}))


async def chat(request: web.Request) -> web.StreamResponse:
    body = await request.json()
    prompt = str(body["messages"][-1].get("content"))
    token = event({"choices": [{"index": 0, "delta": {"content": "ok"}}]})
    return await behave(request, prompt, token, event({"choices": ["not an object"]}))


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response({"open_streams": OPEN["streams"]})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    app.router.add_post("/generate", generate)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=parser.parse_args().port, print=None,
                access_log=None)


if __name__ == "__main__":
    main()
