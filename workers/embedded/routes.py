"""The worker's HTTP routes: SGLang 0.5.23's `/generate`, its OpenAI routes, and the
introspection routes; each parses (`parsing`), admits a `Run`, and shapes the answer
(`responses`, `introspection`). docs/WORKER.md lists where each shape comes from."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, Response, StreamingResponse

from policies.fleet import WORKER_BATCH_KEY
from workers.embedded import introspection, parsing, responses, tools
from workers.embedded.admitted import Admitted, Chunks, Run, Tail, admit, finish_all, sse_stream
from workers.embedded.context import WorkerState
from workers.embedded.errors import WorkerError
from workers.embedded.scheduler import StepEvent
from workers.embedded.spans import WorkerTrace

log = logging.getLogger("specroute.worker")

# ---------------------------------------------------------------- /generate


def _trace(request: Request, req: parsing.GenerateRequest, route: str) -> WorkerTrace | None:
    """The request's spans, continuing the caller's traceparent; None when not exported."""
    tracer = request.app.state.tracer
    if tracer is None:
        return None
    state: WorkerState = request.app.state.worker
    return WorkerTrace(tracer, request.headers, route, req.method or state.config.method,
                       req.k)


def _token_text(state: WorkerState) -> responses.TokenText:
    return lambda token: state.engine.tokenizer.decode([token])


def _generate_chunk(run: Run, event: StepEvent) -> list[Any]:
    # SGLang's default (no --incremental-streaming-output): cumulative text and ids.
    info = run.meta_info(event)
    top = run.req.sampling.top_logprobs
    if top is not None:
        text = _token_text(run.state) if run.req.return_text_in_logprobs else None
        info.update(responses.sglang_logprobs(run.logprobs, top, text))
    return [{"text": run.text, "output_ids": list(run.output_ids), "meta_info": info}]


async def generate(request: Request) -> Response:
    state: WorkerState = request.app.state.worker
    req = parsing.parse_generate(parsing.parse_json(await request.body()))
    req = parsing.with_stop_ids(req, state.engine.tokenizer.stop_ids)
    admitted = await admit(state, req, _trace(request, req, "generate"))
    if req.stream:
        return StreamingResponse(sse_stream(admitted, _generate_chunk, lambda r, e: []),
                                 media_type="text/event-stream")
    run, _ = admitted[0]
    event = (await finish_all(request, admitted))[0]
    return JSONResponse(_generate_chunk(run, event)[0])


# ---------------------------------------------------------------- OpenAI routes


def _openai(state: WorkerState, run: Run, kind: str) -> dict[str, Any]:
    prefix = "chatcmpl-" if kind == "chat" else "cmpl-"
    obj = "chat.completion" if kind == "chat" else "text_completion"
    return {"id": prefix + run.req.rid, "object": obj, "created": int(time.time()),
            "model": run.req.model or state.config.served_model_name}


def _totals(runs: list[Run], events: list[StepEvent]) -> dict[str, Any]:
    """meta_info of n samples together: the prompt counted once, the rest summed (SGLang's
    aggregate_token_usage for n > 1)."""
    infos = [run.meta_info(event) for run, event in zip(runs, events, strict=True)]
    total = dict(infos[0])
    for key in ("completion_tokens", "spec_verify_ct", "spec_num_correct_drafts",
                "spec_num_proposed_drafts"):
        if key in total:
            total[key] = sum(info[key] for info in infos)
    if "spec_verify_ct" in total:
        proposed = total["spec_num_proposed_drafts"]
        total["spec_accept_length"] = total["completion_tokens"] / total["spec_verify_ct"]
        total["spec_accept_rate"] = total["spec_num_correct_drafts"] / proposed \
            if proposed else 0.0
        total["spec_correct_drafts_histogram"] = responses.merge_histograms(
            [info.get("spec_correct_drafts_histogram", []) for info in infos])
    if WORKER_BATCH_KEY in total:
        total[WORKER_BATCH_KEY] = responses.merge_batch(
            [info[WORKER_BATCH_KEY] for info in infos])
    if responses.DRAFTS_KEY in total:
        total[responses.DRAFTS_KEY] = responses.merge_drafts(
            [info[responses.DRAFTS_KEY] for info in infos if responses.DRAFTS_KEY in info])
    return total


def _sglext(run: Run, info: dict[str, Any]) -> dict[str, Any] | None:
    """SGLang's sglext (spec_tokens_details when asked for) plus our `specroute_batch`,
    which every finished answer carries, plain ones too, and a hybrid's `specroute_drafts`."""
    ext: dict[str, Any] = {}
    details = responses.spec_tokens_details(info) if run.req.return_spec_tokens_details else None
    if details is not None:
        ext["spec_tokens_details"] = details
    for key in (WORKER_BATCH_KEY, responses.DRAFTS_KEY):
        if key in info:
            ext[key] = info[key]
    return ext or None


def _logprobs(run: Run, logprobs: list, kind: str, offset: int = 0) -> dict[str, Any] | None:
    if run.req.sampling.top_logprobs is None:
        return None
    text = _token_text(run.state)
    if kind == "chat":
        return responses.chat_logprobs(logprobs, text)
    return responses.completion_logprobs(logprobs, text, offset)


def _tool_calls(run: Run, reason: str | None) -> list[dict[str, Any]] | None:
    """The answer's tool call, when the request has tools and the answer is one."""
    if run.req.tool_mode is None or reason != "stop":
        return None
    return tools.parse_call(run.text)


def _holding(run: Run) -> bool:
    """A streamed answer that is (or may become) a tool call is sent whole at the end."""
    return run.req.tool_mode == "forced" or (
        run.req.tool_mode == "auto" and run.text.startswith("<"))


def _choice(run: Run, event: StepEvent, kind: str) -> dict[str, Any]:
    reason, matched = responses.openai_finish(run.meta_info(event))
    choice: dict[str, Any] = {"index": run.index, "logprobs": _logprobs(run, run.logprobs, kind),
                              "finish_reason": reason, "matched_stop": matched}
    calls = _tool_calls(run, reason)
    if kind == "chat" and calls is not None:
        choice["finish_reason"] = "tool_calls"
        choice["message"] = {"role": "assistant", "content": None,
                             "reasoning_content": None, "tool_calls": calls}
    elif kind == "chat":
        choice["message"] = {"role": "assistant", "content": run.text,
                             "reasoning_content": None, "tool_calls": None}
    else:
        choice["text"] = run.text
    return choice


def _openai_body(state: WorkerState, admitted: Admitted, events: list[StepEvent],
                 kind: str) -> dict[str, Any]:
    runs = [run for run, _ in admitted]
    info = _totals(runs, events)
    body = {**_openai(state, runs[0], kind),
            "choices": [_choice(run, event, kind) for run, event in zip(runs, events,
                                                                         strict=True)],
            "metadata": None,
            "usage": responses.usage(info["prompt_tokens"], info["completion_tokens"])}
    if (ext := _sglext(runs[0], info)) is not None:
        body["sglext"] = ext
    return body


def _openai_chunks(state: WorkerState, kind: str) -> Chunks:
    def chunks(run: Run, event: StepEvent) -> list[Any]:
        head = {**_openai(state, run, kind)}
        head["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
        reason, matched = responses.openai_finish(run.meta_info(event))
        delta = event.output.text
        new = event.output.logprobs or []
        offset = len(run.text) - len(delta)
        choice: dict[str, Any] = {"index": run.index,
                                  "logprobs": _logprobs(run, new, kind, offset),
                                  "finish_reason": reason, "matched_stop": matched}
        if kind == "chat":
            choice["delta"] = {"role": "assistant", "content": delta} if \
                len(run.output_ids) == len(event.output.token_ids) else {"content": delta}
            if _holding(run):
                calls = _tool_calls(run, reason) if event.output.finished else None
                if calls is not None:
                    choice["finish_reason"] = "tool_calls"
                    choice["delta"] = {"tool_calls": [{"index": 0, **calls[0]}]}
                else:  # held until the end; then the text as it is if it is no call
                    choice["delta"]["content"] = run.text if event.output.finished else ""
        else:
            choice["text"] = delta
        return [{**head, "choices": [choice]}]
    return chunks


def _openai_tail(state: WorkerState, kind: str) -> Tail:
    """After the last token: an sglext chunk, then a usage chunk (SGLang's order)."""
    def tail(runs: list[Run], events: list[StepEvent]) -> list[Any]:
        info = _totals(runs, events)
        head = {**_openai(state, runs[0], kind), "choices": []}
        head["object"] = "chat.completion.chunk" if kind == "chat" else "text_completion"
        out = []
        if (ext := _sglext(runs[0], info)) is not None:
            out.append({**head, "sglext": ext})
        if runs[0].req.include_usage:
            out.append({**head, "usage": responses.usage(info["prompt_tokens"],
                                                        info["completion_tokens"])})
        return out
    return tail


async def _openai_route(request: Request, kind: str) -> Response:
    state: WorkerState = request.app.state.worker
    body = parsing.parse_json(await request.body())
    tokenizer = state.engine.tokenizer
    if kind == "chat":
        req = parsing.parse_chat(body, tokenizer.encode_chat)
    else:
        req = parsing.parse_completion(body)
    req = parsing.with_stop_ids(req, tokenizer.stop_ids)
    admitted = await admit(state, req, _trace(request, req, kind))
    if req.stream:
        return StreamingResponse(
            sse_stream(admitted, _openai_chunks(state, kind), _openai_tail(state, kind)),
            media_type="text/event-stream")
    events = await finish_all(request, admitted)
    return JSONResponse(_openai_body(state, admitted, events, kind))


async def completions(request: Request) -> Response:
    return await _openai_route(request, "completion")


async def chat_completions(request: Request) -> Response:
    return await _openai_route(request, "chat")


# ---------------------------------------------------------------- info routes


async def health(request: Request) -> Response:
    return Response(status_code=200)


async def get_server_info(request: Request) -> Response:
    return JSONResponse(introspection.server_info(request.app.state.worker))


async def get_model_info(request: Request) -> Response:
    return JSONResponse(introspection.model_info(request.app.state.worker))


async def list_models(request: Request) -> Response:
    return JSONResponse({"object": "list",
                         "data": [introspection.model_card(request.app.state.worker)]})


async def loads(request: Request) -> Response:
    return JSONResponse(introspection.loads(request.app.state.worker))


async def metrics(request: Request) -> Response:
    return Response(introspection.metrics_text(request.app.state.worker),
                    media_type="text/plain; version=0.0.4; charset=utf-8")


async def worker_error(request: Request, exc: Exception) -> Response:
    """The one place a WorkerError becomes an HTTP answer."""
    assert isinstance(exc, WorkerError)
    log.log(logging.WARNING if exc.status_code >= 500 else logging.INFO, "%s %s: %d %s",
            request.method, request.url.path, exc.status_code, type(exc).__name__)
    if request.url.path.startswith("/v1/"):
        body: dict[str, Any] = responses.error_body(str(exc), exc.status_code)
    else:  # SGLang's native routes: {"error": {"message": ...}}
        body = {"error": {"message": str(exc)}}
    return JSONResponse(body, status_code=exc.status_code)
