"""A small real HTTP server shaped like an SGLang 0.5.23 worker, for gateway tests.

Shapes follow the sglang 0.5.23 wheel: `/generate` (`meta_info` with `prompt_tokens`,
`completion_tokens`, `e2e_latency`, `finish_reason` as `{"type": "stop"|"length", ...}`
and the `spec_*` counters; streamed `text`/`output_ids` CUMULATIVE unless
`--incremental`), the OpenAI routes with `sglext.spec_tokens_details` when
`return_spec_tokens_details` is set, `/health`, `/server_info`, `/model_info`,
`/v1/models`. Output is deterministic: the prompt's words echoed back, one word per
token. Prompt words trigger failures: TRIGGER_400 (a 4xx), TRIGGER_SLOW (sleeps 3 s),
TRIGGER_MIDSTREAM_ERROR (an in-band error after two chunks). `--stall S` waits S seconds
before answering `/generate`, `--drip S` between streamed chunks (both routes); a client that leaves
meanwhile is counted in `GET /stats` (`generate_calls`, `in_flight`, `cancelled`, the
`last_k` / `last_method` / `last_max_tokens` the last request ran with, read from `custom_params` as the
embedded worker reads them, and that request's whole `last_body`).
`--fault MODE` makes every generation answer broken on the wire (health stays 200):
`garbage` (a 200 that is not JSON), `truncated` (a 200 whose JSON is cut in half),
`status500`, `close-mid-chunk` (a stream: one token, then half an event and the
connection closed; not streaming: half the body, then closed), or a malformed shape of
well-formed JSON (`tests/stub_shapes.py`: counters as strings, lists for objects, no
choices, bad stream choices, bad usage; `/server_info` malformed too).

    python tests/sglang_stub.py --port P [--model NAME] [--method M] [--k K]
                                [--fail-after N] [--incremental] [--stall S] [--drip S]
                                [--accept-length X] [--step-s S] [--no-constrained]
                                [--fault garbage|truncated|status500|close-mid-chunk|SHAPE]
                                [--api-key KEY]
"""

from __future__ import annotations

import argparse
import asyncio
import math
import time
import uuid
from dataclasses import dataclass

import orjson
import stub_shapes
from aiohttp import web


@dataclass
class StubConfig:
    model: str = "stub-model"
    method: str = "eagle"
    k: int = 3
    fail_after: int = -1  # generation requests served before failing; -1 = never
    incremental: bool = False
    stall_s: float = 0.0
    drip_s: float = 0.0
    served: int = 0
    generate_calls: int = 0
    in_flight: int = 0
    cancelled: int = 0
    last_k: int | None = None
    last_method: str | None = None  # the method the last request ran with (custom_params)
    last_max_tokens: int | None = None  # the token budget the last request was sent with
    last_body: dict | None = None  # the last generation request's body, as it arrived
    accept_length: float = 3.0  # tokens per verify step reported (capped at k + 1)
    step_s: float = 0.0  # simulated time per verify step (per token when not speculating)
    no_constrained: bool = False  # 400 on response_format / json_schema, as the embedded engine
    fault: str | None = None  # FAULTS: how every /generate answer is broken
    health_stall_s: float = 0.0  # /health answers after this long (a busy server)
    api_key: str | None = None  # as SGLang's --api-key: a Bearer key on all but health

    def failing(self) -> bool:
        return 0 <= self.fail_after <= self.served


def words_of(text: str) -> list[str]:
    return text.split()


def prompt_text(body: dict) -> str:
    if "messages" in body:
        parts = []
        for message in body["messages"]:
            content = message.get("content") or ""
            if isinstance(content, list):  # content parts; the gateway checked their text
                content = " ".join(p.get("text") or "" for p in content)
            parts.append(content)
        return " ".join(parts)
    prompt = body.get("prompt") or body.get("text") or body.get("input_ids") or ""
    if isinstance(prompt, list):
        return " ".join(str(t) for t in prompt) if prompt and isinstance(prompt[0], int) \
            else " ".join(prompt)
    return prompt


def last_user_text(body: dict) -> str:
    if "messages" not in body:
        return prompt_text(body)
    users = [m for m in body["messages"] if m.get("role") == "user"]
    return prompt_text({"messages": users[-1:]})


@dataclass
class Plan:
    """What the stub will generate for one request."""

    words: list[str]
    prompt_tokens: int
    finish: dict
    spec: dict


def plan(cfg: StubConfig, prompt: str, source: str, max_tokens: int | None,
         stop: list[str] | str | None, k: int) -> Plan:
    limit = 16 if max_tokens is None else max_tokens
    words = words_of(source) or ["ok"]
    out = [words[i % len(words)] for i in range(limit)]
    finish: dict = {"type": "length", "length": limit}
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    for i, word in enumerate(out):
        if word in stops:
            out, finish = out[:i], {"type": "stop", "matched": word}
            break
    if len(words) < limit and finish["type"] == "length":
        out, finish = out[: len(words)], {"type": "stop", "matched": None}
    n = len(out)
    spec: dict = {}
    if cfg.method != "plain" and k > 0 and n:
        verify = math.ceil(n / min(k + 1, cfg.accept_length))
        proposed = verify * k
        correct = n - verify
        spec = {"spec_verify_ct": verify, "spec_accept_length": n / verify,
                "spec_accept_rate": correct / proposed, "spec_num_correct_drafts": correct,
                "spec_num_proposed_drafts": proposed}
    return Plan(out, len(words_of(prompt)), finish, spec)


def request_method(cfg: StubConfig, custom: dict | None) -> str:
    """The embedded worker's rule: `custom_params.method` if given, else its own."""
    if custom and isinstance(custom.get("method"), str):
        return custom["method"]
    return cfg.method


def request_k(cfg: StubConfig, custom: dict | None) -> int:
    if custom and "num_speculative_tokens" in custom:
        return int(custom["num_speculative_tokens"])
    return cfg.k


def reject(status: int, message: str) -> web.Response:
    return web.json_response({"error": {"message": message}}, status=status)


def openai_reject(status: int, message: str) -> web.Response:
    """SGLang's OpenAI routes answer a flat ErrorResponse (serving_base.py)."""
    return web.json_response({"object": "error", "message": message,
                              "type": "BadRequestError", "param": None, "code": status},
                             status=status)


class ClientLeft(Exception):
    """The gateway closed the connection while the stub was working."""


async def pause(request: web.Request, seconds: float) -> None:
    """Sleep, noticing within 20 ms when the client has closed the connection."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if request.transport is None or request.transport.is_closing():
            raise ClientLeft
        await asyncio.sleep(min(0.02, max(0.0, deadline - time.monotonic())))


FAULTS = ("garbage", "truncated", "status500", "close-mid-chunk", *stub_shapes.SHAPES)


async def malformed_answer(request: web.Request, shape: str, stream: bool,
                           chat: bool | None) -> web.StreamResponse:
    """A 200 of well-formed JSON in the wrong shape (stub_shapes); chat None: /generate."""
    reply = stub_shapes.generate_reply(shape, stream) if chat is None \
        else stub_shapes.openai_reply(shape, chat, stream)
    if not stream:
        return web.json_response(reply, dumps=lambda o: orjson.dumps(o).decode())
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    await resp.write(b"data: " + orjson.dumps(reply) + b"\n\n" + b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp


async def broken_answer(request: web.Request, fault: str, stream: bool,
                        chat: bool | None) -> web.StreamResponse:
    """One answer broken as `fault` says (FAULTS), in the route's shape."""
    if fault in stub_shapes.SHAPES:
        return await malformed_answer(request, fault, stream, chat)
    if chat:
        token = b"data: " + orjson.dumps({"id": "x", "object": "chat.completion.chunk",
                                           "choices": [{"index": 0, "delta": {
                                               "content": "ok"}, "finish_reason": None}]})
        whole = orjson.dumps({"id": "x", "object": "chat.completion", "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"},
             "finish_reason": "stop"}], "usage": {"prompt_tokens": 1,
                                                  "completion_tokens": 1, "total_tokens": 2}})
    else:
        token = b"data: " + orjson.dumps({"text": "ok", "output_ids": [100], "meta_info": {
            "id": "x", "prompt_tokens": 1, "completion_tokens": 1, "finish_reason": None}})
        whole = orjson.dumps({"text": "ok", "output_ids": [100], "meta_info": {
            "id": "x", "prompt_tokens": 1, "completion_tokens": 1,
            "finish_reason": {"type": "stop"}}})
    if fault == "status500":
        return web.json_response({"error": {"message": "stub fault"}}, status=500)
    if fault == "garbage" and not stream:
        return web.Response(body=b"<html>502 Bad Gateway</html>", content_type="text/html")
    if fault == "truncated" and not stream:
        return web.Response(body=whole[: len(whole) // 2], content_type="application/json")
    if fault == "close-mid-chunk" and not stream:
        resp = web.StreamResponse(headers={"Content-Type": "application/json",
                                           "Content-Length": str(len(whole))})
        await resp.prepare(request)
        await resp.write(whole[: len(whole) // 2])
        assert request.transport is not None
        request.transport.close()
        return resp
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)
    if fault == "garbage":
        await resp.write(b"data: <html>502 Bad Gateway</html>\n\n")
    elif fault == "truncated":
        await resp.write(token[: len(token) // 2] + b"\n\n")
    else:  # close-mid-chunk: a token, then half of the next event, then the connection goes
        await resp.write(token + b"\n\n")
        await asyncio.sleep(0.05)
        await resp.write(token[: len(token) // 2])
        assert request.transport is not None
        request.transport.close()
    return resp


class StubServer:
    def __init__(self, cfg: StubConfig) -> None:
        self.cfg = cfg

    async def stats(self, request: web.Request) -> web.Response:
        c = self.cfg
        return web.json_response({"generate_calls": c.generate_calls, "in_flight": c.in_flight,
                                  "cancelled": c.cancelled, "served": c.served,
                                  "last_k": c.last_k, "last_method": c.last_method,
                                  "last_max_tokens": c.last_max_tokens,
                                  "last_body": c.last_body})

    async def admit(self, prompt: str) -> web.Response | None:
        if self.cfg.failing():
            return reject(500, "stub worker is failing on purpose")
        self.cfg.served += 1
        if "TRIGGER_400" in prompt:
            return reject(400, "stub rejected the request: TRIGGER_400")
        if "TRIGGER_SLOW" in prompt:
            await asyncio.sleep(3)
        return None

    async def steps(self, request: web.Request, p: Plan) -> None:
        """Take `step_s` per verify step, as a real engine would (before answering)."""
        if self.cfg.step_s:
            await pause(request, self.cfg.step_s * p.spec.get("spec_verify_ct", len(p.words)))

    # --- native routes --------------------------------------------------------------
    async def generate(self, request: web.Request) -> web.StreamResponse:
        self.cfg.generate_calls += 1
        self.cfg.in_flight += 1
        try:
            await pause(request, self.cfg.stall_s)
            return await self._generate(request)
        except (ClientLeft, ConnectionResetError, asyncio.CancelledError):
            self.cfg.cancelled += 1
            raise
        finally:
            self.cfg.in_flight -= 1

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = self.cfg.last_body = await request.json(loads=orjson.loads)
        if self.cfg.fault is not None:
            return await broken_answer(request, self.cfg.fault, bool(body.get("stream")),
                                       chat=None)
        prompt = prompt_text(body)
        if (failure := await self.admit(prompt)) is not None:
            return failure
        params = body.get("sampling_params") or {}
        if self.cfg.no_constrained and params.get("json_schema"):
            return reject(400, "constrained decoding is not supported (json_schema)")
        self.cfg.last_k = request_k(self.cfg, params.get("custom_params"))
        self.cfg.last_method = request_method(self.cfg, params.get("custom_params"))
        self.cfg.last_max_tokens = params.get("max_new_tokens")
        p = plan(self.cfg, prompt, prompt, params.get("max_new_tokens", 128),
                 params.get("stop"), self.cfg.last_k)
        await self.steps(request, p)
        start = time.perf_counter()

        def meta(done: int, final: bool) -> dict:
            info = {"id": body.get("rid") or uuid.uuid4().hex, "prompt_tokens": p.prompt_tokens,
                    "completion_tokens": done, "cached_tokens": 0,
                    "finish_reason": p.finish if final else None,
                    "e2e_latency": time.perf_counter() - start}
            return {**info, **p.spec} if final else info

        ids = list(range(100, 100 + len(p.words)))
        if not body.get("stream"):
            return web.json_response({"text": " ".join(p.words), "output_ids": ids,
                                      "meta_info": meta(len(p.words), True)},
                                     dumps=lambda o: orjson.dumps(o).decode())
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(1, len(p.words) + 1):
            if i > 1:
                await pause(request, self.cfg.drip_s)
            if "TRIGGER_MIDSTREAM_ERROR" in prompt and i == 3:
                await resp.write(b"data: " + orjson.dumps(
                    {"error": {"message": "stub failed mid-stream"}}) + b"\n\n")
                break
            if self.cfg.incremental:
                text = (" " if i > 1 else "") + p.words[i - 1]
                chunk_ids = ids[i - 1:i]
            else:
                text, chunk_ids = " ".join(p.words[:i]), ids[:i]
            chunk = {"text": text, "output_ids": chunk_ids,
                     "meta_info": meta(i, i == len(p.words))}
            await resp.write(b"data: " + orjson.dumps(chunk) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    async def health(self, request: web.Request) -> web.Response:
        if self.cfg.health_stall_s:
            await asyncio.sleep(self.cfg.health_stall_s)
        return web.Response(status=503 if self.cfg.failing() else 200)

    async def server_info(self, request: web.Request) -> web.Response:
        if self.cfg.fault in stub_shapes.SHAPES:
            return web.json_response(stub_shapes.server_info(self.cfg.fault))
        return web.json_response({
            "model_path": self.cfg.model, "served_model_name": self.cfg.model,
            "speculative_algorithm": None if self.cfg.method == "plain" else self.cfg.method.upper(),
            "speculative_num_draft_tokens": self.cfg.k + 1,
            "internal_states": [{"avg_spec_accept_length": min(self.cfg.k + 1, 3)}]})

    async def model_info(self, request: web.Request) -> web.Response:
        return web.json_response({"model_path": self.cfg.model, "tokenizer_path": self.cfg.model,
                                  "is_generation": True})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [
            {"id": self.cfg.model, "object": "model", "created": 0, "owned_by": "sglang"}]})

    # --- OpenAI routes --------------------------------------------------------------
    def extension(self, body: dict, p: Plan) -> dict:
        """Where the engine's per-request speculation facts go: SGLang's `sglext`."""
        if body.get("return_spec_tokens_details") and p.spec:
            return {"sglext": {"spec_tokens_details": p.spec}}
        return {}

    async def openai(self, request: web.Request) -> web.StreamResponse:
        self.cfg.generate_calls += 1
        chat = request.path.endswith("/chat/completions")
        body = self.cfg.last_body = await request.json(loads=orjson.loads)
        if self.cfg.fault is not None:
            return await broken_answer(request, self.cfg.fault, bool(body.get("stream")),
                                       chat=chat)
        prompt = prompt_text(body)
        if (failure := await self.admit(prompt)) is not None:
            return openai_reject(failure.status, "stub rejected or failed the request")
        if self.cfg.no_constrained and body.get("response_format"):
            return openai_reject(400, "constrained decoding is not supported (response_format)")
        if body.get("model") != self.cfg.model:
            return openai_reject(404, f"model {body.get('model')!r} not served here")
        max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
        self.cfg.last_k = request_k(self.cfg, body.get("custom_params"))
        self.cfg.last_method = request_method(self.cfg, body.get("custom_params"))
        self.cfg.last_max_tokens = max_tokens
        p = plan(self.cfg, prompt, last_user_text(body), max_tokens, body.get("stop"),
                 self.cfg.last_k)
        await self.steps(request, p)
        finish = p.finish["type"]
        usage = {"prompt_tokens": p.prompt_tokens, "completion_tokens": len(p.words),
                 "total_tokens": p.prompt_tokens + len(p.words)}
        base = {"id": uuid.uuid4().hex, "created": int(time.time()), "model": self.cfg.model}
        text = " ".join(p.words)
        if not body.get("stream"):
            if chat and body.get("tools") and body.get("tool_choice") != "none":
                tool = body["tools"][0]["function"]["name"]
                message = {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": tool, "arguments": orjson.dumps(
                         {"text": text}).decode()}}]}
                choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            elif chat:
                choice = {"index": 0, "message": {"role": "assistant", "content": text},
                          "finish_reason": finish}
            else:
                choice = {"index": 0, "text": text, "finish_reason": finish}
            return web.json_response({**base, "object": "chat.completion" if chat
                                      else "text_completion", "choices": [choice],
                                      "usage": usage, **self.extension(body, p)})
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        kind = "chat.completion.chunk" if chat else "text_completion"
        for i, word in enumerate(p.words):
            if i:
                try:
                    await pause(request, self.cfg.drip_s)
                except ClientLeft:
                    self.cfg.cancelled += 1
                    return resp
            piece = (" " if i else "") + word
            choice = ({"index": 0, "delta": {"role": "assistant", "content": piece}
                       if i == 0 else {"content": piece}, "finish_reason": None} if chat
                      else {"index": 0, "text": piece, "finish_reason": None})
            await resp.write(b"data: " + orjson.dumps({**base, "object": kind,
                                                        "choices": [choice]}) + b"\n\n")
        last = ({"index": 0, "delta": {}, "finish_reason": finish} if chat
                else {"index": 0, "text": "", "finish_reason": finish})
        await resp.write(b"data: " + orjson.dumps({**base, "object": kind,
                                                    "choices": [last]}) + b"\n\n")
        for extra in self.stream_tail(body, p, usage):
            await resp.write(b"data: " + orjson.dumps({**base, "object": kind,
                                                        "choices": [], **extra}) + b"\n\n")
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    def stream_tail(self, body: dict, p: Plan, usage: dict) -> list[dict]:
        """SGLang: an sglext chunk, then the usage chunk if include_usage."""
        tail = []
        if ext := self.extension(body, p):
            tail.append(ext)
        if (body.get("stream_options") or {}).get("include_usage"):
            tail.append({"usage": usage})
        return tail

    @web.middleware
    async def check_key(self, request: web.Request, handler):  # noqa: ANN001, ANN201
        """SGLang 0.5.23's rule (srt/utils/auth.py): /health*, /ready*, /metrics open."""
        open_path = request.path.startswith(("/health", "/ready", "/metrics", "/stats"))
        if self.cfg.api_key and not open_path and \
                request.headers.get("Authorization") != f"Bearer {self.cfg.api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    def app(self) -> web.Application:
        app = web.Application(client_max_size=64 * 1024 * 1024, middlewares=[self.check_key])
        app.router.add_post("/generate", self.generate)
        app.router.add_get("/health", self.health)
        app.router.add_get("/stats", self.stats)
        app.router.add_get("/health_generate", self.health)
        app.router.add_get("/server_info", self.server_info)
        app.router.add_get("/get_server_info", self.server_info)
        app.router.add_get("/model_info", self.model_info)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/v1/completions", self.openai)
        return app


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, StubConfig]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--model", default="stub-model")
    parser.add_argument("--method", default="eagle")
    parser.add_argument("--k", type=int, default=3)
    parser.add_argument("--fail-after", type=int, default=-1)
    parser.add_argument("--incremental", action="store_true",
                        help="stream deltas, as with --incremental-streaming-output")
    parser.add_argument("--stall", type=float, default=0.0)
    parser.add_argument("--drip", type=float, default=0.0)
    parser.add_argument("--accept-length", type=float, default=3.0,
                        help="tokens per verify step to report (capped at k + 1)")
    parser.add_argument("--step-s", type=float, default=0.0,
                        help="seconds per verify step before answering")
    parser.add_argument("--no-constrained", action="store_true",
                        help="reject response_format/json_schema with a 400")
    parser.add_argument("--fault", choices=FAULTS, default=None,
                        help="break every /generate answer this way")
    parser.add_argument("--api-key", default=None, help="require this Bearer key")
    args = parser.parse_args(argv)
    return args, StubConfig(model=args.model, method=args.method, k=args.k,
                            fail_after=args.fail_after, incremental=args.incremental,
                            stall_s=args.stall, drip_s=args.drip,
                            accept_length=args.accept_length,
                            no_constrained=args.no_constrained, step_s=args.step_s,
                            fault=args.fault, api_key=args.api_key)


if __name__ == "__main__":
    args, cfg = parse_args()
    web.run_app(StubServer(cfg).app(), host=args.host, port=args.port, print=None,
                access_log=None)
