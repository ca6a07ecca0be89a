"""The embedded worker's HTTP server: SGLang 0.5.23's HTTP surface over the Engine.

Routes: `/generate`, `/v1/completions`, `/v1/chat/completions`, `/server_info`
(`/get_server_info`), `/model_info` (`/get_model_info`), `/health`, `/health_generate`,
`/v1/models`, `/v1/loads`, `/metrics`. Parsing and response shapes live in `protocol`;
the torch work runs on the engine thread in `scheduler`; this module wires the two to
HTTP and never blocks the event loop. docs/WORKER.md lists where each shape comes from.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from workers.embedded import protocol
from workers.embedded.protocol import BadRequest, GenerateRequest, WorkerError
from workers.embedded.scheduler import ErrorEvent, Scheduler, StepEvent, Ticket

VERSION = "specroute-embedded"


@dataclass
class WorkerConfig:
    method: str
    k: int | None  # the worker's default k; None: the engine's default for the method
    model_path: str
    served_model_name: str
    max_running: int = 4
    max_queue: int = 64


@dataclass
class WorkerState:
    engine: Any
    scheduler: Scheduler
    config: WorkerConfig
    started: float


def _engine_types() -> tuple[type, type]:
    from workers.embedded.engine import EngineInputError, SamplingParams

    return EngineInputError, SamplingParams


# ---------------------------------------------------------------- one request


class Run:
    """One admitted request: its ticket, its accumulated output, and the event stream."""

    def __init__(self, state: WorkerState, req: GenerateRequest) -> None:
        self.state, self.req = state, req
        self.started = time.perf_counter()
        self.ticket: Ticket | None = None
        self.text = ""
        self.output_ids: list[int] = []
        self.done = False
        self.speculative = False

    def submit(self) -> None:
        engine, config, req = self.state.engine, self.state.config, self.req
        ids = req.input_ids if req.input_ids is not None else engine.tokenizer.encode(req.text)
        if not ids:
            raise BadRequest("the prompt encodes to no tokens")
        vocab = getattr(engine.tokenizer, "vocab_size", None)
        if vocab is not None and any(not 0 <= t < vocab for t in ids):
            raise BadRequest(f"input_ids must be in [0, {vocab})")
        context = engine.max_context
        if len(ids) >= context:
            raise BadRequest(f"The input ({len(ids)} tokens) is longer than the model's "
                             f"context length ({context} tokens).")
        max_new = req.sampling.max_new_tokens
        if max_new is None:
            max_new = context - len(ids)
        elif len(ids) + max_new > context:
            raise BadRequest(f"Requested token count exceeds the model's maximum context length "
                             f"of {context} tokens: {len(ids)} input + {max_new} new tokens.")
        method = req.method or config.method
        if method not in engine.methods:
            raise BadRequest(f"unknown method {method!r}; this worker has {list(engine.methods)}")
        k = req.k if req.k is not None else (config.k if method == config.method else None)
        if k == 0:  # k = 0 means no speculation, whatever the method (DESIGN.md)
            method, k = "plain", None
        self.speculative = method != "plain" and (
            k if k is not None else engine.default_k.get(method, 0)) > 0
        _, sampling_params = _engine_types()
        spec = req.sampling
        params = sampling_params(
            max_new_tokens=max_new, temperature=spec.temperature, top_p=spec.top_p,
            top_k=spec.top_k, stop=spec.stop, stop_token_ids=spec.stop_token_ids,
            ignore_eos=spec.ignore_eos, seed=spec.seed,
        )
        self.ticket = self.state.scheduler.submit(ids, params, method, k)

    async def next_event(self) -> StepEvent:
        """The next step; engine errors become WorkerErrors (400 for bad input)."""
        assert self.ticket is not None
        event = await self.ticket.events.get()
        if isinstance(event, ErrorEvent):
            self.done = True
            engine_input_error, _ = _engine_types()
            if isinstance(event.error, engine_input_error):
                raise BadRequest(str(event.error)) from event.error
            raise WorkerError(f"engine failure: {event.error}") from event.error
        self.text += event.output.text
        self.output_ids.extend(event.output.token_ids)
        self.done = event.output.finished
        return event

    def meta_info(self, event: StepEvent) -> dict[str, Any]:
        return protocol.meta_info(self.req.rid, event.output, event.stats, self.started,
                                  self.speculative)

    def cancel(self) -> None:
        if self.ticket is not None and not self.done:
            self.state.scheduler.cancel(self.ticket)
            self.done = True

    async def final(self, request: Request) -> StepEvent:
        """Run to the end; a client that disconnects meanwhile cancels the generation."""
        watcher = asyncio.ensure_future(_disconnected(request))
        try:
            while True:
                step = asyncio.ensure_future(self.next_event())
                done, _ = await asyncio.wait({step, watcher}, return_when=asyncio.FIRST_COMPLETED)
                if step not in done:
                    step.cancel()
                    self.cancel()
                    raise asyncio.CancelledError
                event = step.result()
                if event.output.finished:
                    return event
        finally:
            watcher.cancel()
            self.cancel()


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


def _sse(obj: Any) -> bytes:
    return b"data: " + orjson.dumps(obj) + b"\n\n"


DONE = b"data: [DONE]\n\n"


async def _stream(run: Run, first: StepEvent,
                  chunks: Callable[[Run, StepEvent], list[Any]],
                  tail: Callable[[Run, StepEvent], list[Any]]) -> AsyncIterator[bytes]:
    """SSE body: chunks per step, tail chunks after the last; cancels on disconnect."""
    event = first
    try:
        while True:
            for chunk in chunks(run, event):
                yield _sse(chunk)
            if event.output.finished:
                break
            event = await run.next_event()
        for chunk in tail(run, event):
            yield _sse(chunk)
    except WorkerError as exc:
        yield _sse({"error": {"message": str(exc), "type": "invalid_request_error",
                              "code": exc.status_code, "retryable": False}})
    finally:
        run.cancel()
    yield DONE


async def _admit(state: WorkerState, req: GenerateRequest) -> tuple[Run, StepEvent]:
    """Submit and wait for the first step, so bad input is a 400 before any stream starts."""
    run = Run(state, req)
    run.submit()
    try:
        return run, await run.next_event()
    except BaseException:
        run.cancel()
        raise


# ---------------------------------------------------------------- /generate


def _generate_chunk(run: Run, event: StepEvent) -> list[Any]:
    # SGLang's default (no --incremental-streaming-output): cumulative text and ids.
    return [{"text": run.text, "output_ids": list(run.output_ids),
             "meta_info": run.meta_info(event)}]


async def generate(request: Request) -> Response:
    state: WorkerState = request.app.state.worker
    req = protocol.parse_generate(protocol.parse_json(await request.body()))
    run, first = await _admit(state, req)
    if req.stream:
        return StreamingResponse(_stream(run, first, _generate_chunk, lambda r, e: []),
                                 media_type="text/event-stream")
    event = first if first.output.finished else await run.final(request)
    return JSONResponse(_generate_chunk(run, event)[0])


# ---------------------------------------------------------------- OpenAI routes


def _openai(state: WorkerState, run: Run, kind: str) -> dict[str, Any]:
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    obj = "chat.completion" if kind == "chat" else "text_completion"
    return {"id": prefix + run.req.rid, "object": obj, "created": int(time.time()),
            "model": run.req.model or state.config.served_model_name}


def _sglext(run: Run, info: dict[str, Any]) -> dict[str, Any] | None:
    details = protocol.spec_tokens_details(info) if run.req.return_spec_tokens_details else None
    return None if details is None else {"spec_tokens_details": details}


def _openai_body(state: WorkerState, run: Run, event: StepEvent, kind: str) -> dict[str, Any]:
    info = run.meta_info(event)
    reason, matched = protocol.openai_finish(info)
    choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason,
                              "matched_stop": matched}
    if kind == "chat":
        choice["message"] = {"role": "assistant", "content": run.text,
                             "reasoning_content": None, "tool_calls": None}
    else:
        choice["text"] = run.text
    body = {**_openai(state, run, kind), "choices": [choice], "metadata": None,
            "usage": protocol.usage(info["prompt_tokens"], info["completion_tokens"])}
    if (ext := _sglext(run, info)) is not None:
        body["sglext"] = ext
    return body


def _openai_chunks(state: WorkerState, kind: str) -> Callable[[Run, StepEvent], list[Any]]:
    def chunks(run: Run, event: StepEvent) -> list[Any]:
        head = {**_openai(state, run, kind)}
        head["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
        reason, matched = protocol.openai_finish(run.meta_info(event))
        delta = event.output.text
        choice: dict[str, Any] = {"index": 0, "logprobs": None, "finish_reason": reason,
                                  "matched_stop": matched}
        if kind == "chat":
            choice["delta"] = {"role": "assistant", "content": delta} if \
                len(run.output_ids) == len(event.output.token_ids) else {"content": delta}
        else:
            choice["text"] = delta
        return [{**head, "choices": [choice]}]
    return chunks


def _openai_tail(state: WorkerState, kind: str) -> Callable[[Run, StepEvent], list[Any]]:
    """After the last token: an sglext chunk, then a usage chunk (SGLang's order)."""
    def tail(run: Run, event: StepEvent) -> list[Any]:
        info = run.meta_info(event)
        head = {**_openai(state, run, kind), "choices": []}
        head["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
        out = []
        if (ext := _sglext(run, info)) is not None:
            out.append({**head, "sglext": ext})
        if run.req.include_usage:
            out.append({**head, "usage": protocol.usage(info["prompt_tokens"],
                                                        info["completion_tokens"])})
        return out
    return tail


async def _openai_route(request: Request, kind: str) -> Response:
    state: WorkerState = request.app.state.worker
    body = protocol.parse_json(await request.body())
    if kind == "chat":
        from workers.embedded.corpus import render_chat

        req = protocol.parse_chat(body, render_chat)
    else:
        req = protocol.parse_completion(body)
    run, first = await _admit(state, req)
    if req.stream:
        return StreamingResponse(
            _stream(run, first, _openai_chunks(state, kind), _openai_tail(state, kind)),
            media_type="text/event-stream")
    event = first if first.output.finished else await run.final(request)
    return JSONResponse(_openai_body(state, run, event, kind))


async def completions(request: Request) -> Response:
    return await _openai_route(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _openai_route(request, "chat")


# ---------------------------------------------------------------- info routes


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def get_server_info(request: Request) -> Response:
    return JSONResponse(protocol.server_info(request.app.state.worker, VERSION))


async def get_model_info(request: Request) -> Response:
    state: WorkerState = request.app.state.worker
    return JSONResponse({
        "model_path": state.config.model_path,
        "served_model_name": state.config.served_model_name,
        "tokenizer_path": state.config.model_path,
        "is_generation": True, "preferred_sampling_params": None, "weight_version": "default",
        "load_format": "safetensors", "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "has_image_understanding": False, "has_audio_understanding": False,
    })


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list", "data": [protocol.model_card(request.app.state.worker)]})


async def loads(request: Request) -> Response:
    state: WorkerState = request.app.state.worker
    scheduler = state.scheduler
    return JSONResponse({
        "timestamp": datetime.now(UTC).isoformat(), "version": VERSION,
        "accelerator": None, "num_accelerators": 0,
        "loads": [{"dp_rank": 0, "num_running_reqs": scheduler.num_running,
                   "num_waiting_reqs": scheduler.num_queued,
                   "max_running_requests": scheduler.max_running}],
    })


async def metrics(request: Request) -> Response:
    return Response(protocol.metrics_text(request.app.state.worker),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


async def _worker_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, WorkerError)
    if request.url.path.startswith("/v1/"):
        body: dict[str, Any] = protocol.error_body(str(exc), exc.status_code)
    else:  # SGLang's native routes: {"error": {"message": ...}}
        body = {"error": {"message": str(exc)}}
    return JSONResponse(body, status_code=exc.status_code)


# ---------------------------------------------------------------- app and entry point


def create_app(engine: Any, config: WorkerConfig, on_start: Callable[[], Any] | None = None,
               on_stop: Callable[[], Any] | None = None) -> FastAPI:
    """The worker app; the engine thread runs for the app's lifespan."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler = Scheduler(engine, config.max_running, config.max_queue)
        scheduler.start()
        app.state.worker = WorkerState(engine, scheduler, config, time.time())
        if on_start is not None:
            on_start()
        try:
            yield
        finally:
            if on_stop is not None:
                on_stop()
            scheduler.stop()

    app = FastAPI(title="specroute embedded worker", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.add_exception_handler(WorkerError, _worker_error)
    app.add_api_route("/generate", generate, methods=["POST", "PUT"])
    app.add_api_route("/v1/completions", completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", chat_completions, methods=["POST"])
    for path in ("/health", "/health_generate"):
        app.add_api_route(path, health, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, get_server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, get_model_info, methods=["GET"])
    app.add_api_route("/v1/models", list_models, methods=["GET"])
    app.add_api_route("/v1/loads", loads, methods=["GET"])
    app.add_api_route("/metrics", metrics, methods=["GET"])
    return app


def serve_worker(method: str, host: str, port: int, model_dir: str | None,
                 num_speculative_tokens: int | None, threads: int | None,
                 redis_url: str | None, pool: str | None) -> int:
    """Load the engine, then serve until interrupted; registers in Redis when asked."""
    import os

    import torch
    import uvicorn

    from workers.embedded.engine import BUNDLED_MODEL_DIR, Engine

    if threads is not None:
        torch.set_num_threads(threads)
    engine = Engine(model_dir=model_dir)
    if method not in engine.methods:
        raise SystemExit(f"method {method!r} is not loaded; available: {list(engine.methods)}")
    model_path = str(model_dir or BUNDLED_MODEL_DIR)
    config = WorkerConfig(method=method, k=num_speculative_tokens, model_path=model_path,
                          served_model_name=Path(model_path).name or model_path)
    on_start = on_stop = None
    if redis_url is not None:
        from workers.registry import Registration, new_worker_info

        k = num_speculative_tokens if num_speculative_tokens is not None \
            else engine.default_k.get(method, 0)
        # Behind NAT or in a container the bind address is not what peers dial.
        url = os.environ.get("SPECROUTE_ADVERTISE_URL") or f"http://{host}:{port}"
        info = new_worker_info(url=url, pool=pool or f"embedded-{method}", engine="embedded",
                               method=method, k=k, model=config.served_model_name,
                               pid=os.getpid())
        registration = Registration(redis_url, info)
        on_start, on_stop = registration.start, registration.stop
    app = create_app(engine, config, on_start, on_stop)
    uvicorn.run(app, host=host, port=port, log_level="warning", access_log=False)
    return 0
