"""Parsing the worker's requests: SGLang 0.5.23 `/generate` and its OpenAI routes.

Bodies are parsed by hand rather than by pydantic models so that every bad input gets
a short message that names the field, and a malformed body is a 400, never a 500.
Field names and shapes follow the SGLang wheel; docs/WORKER.md cites file and line.
What depends on the model (prompt length, vocabulary, method, k) the engine checks.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from policies.request_limits import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    GRAMMAR_FIELDS,
    JSON_OBJECT_SCHEMA,
    MAX_N,
    RESPONSE_FORMATS,
)
from workers.embedded import tools
from workers.embedded.api import Constraint, SamplingParams
from workers.embedded.errors import BadRequest

# The model's chat prompt as ids (TextTokenizer.encode_chat): ids rather than text, so
# that special-token text in a message stays text.
EncodeChat = Callable[[Sequence[dict[str, str]]], list[int]]

# SGLang's TOP_K_ALL (sampling_params.py): "no top-k cut", like -1.
TOP_K_ALL = 1 << 30
# Sampling options SGLang accepts that this engine does not implement, with the value
# that means "off"; any other value is refused rather than silently ignored.
UNSUPPORTED_DEFAULTS = {"min_p": 0.0, "repetition_penalty": 1.0, "min_new_tokens": 0}


@dataclass
class GenerateRequest:
    """A single `/generate` or OpenAI request, validated, engine-agnostic."""

    text: str | None
    input_ids: list[int] | None
    sampling: SamplingParams  # max_new_tokens None: the rest of the context
    method: str | None = None  # custom_params.method; None: the worker's method
    k: int | None = None  # custom_params.num_speculative_tokens; None: the worker's k
    stream: bool = False
    rid: str = field(default_factory=lambda: uuid.uuid4().hex)
    include_usage: bool = False  # OpenAI stream_options.include_usage
    n: int = 1  # independent samples (OpenAI routes)
    tool_mode: tools.ToolMode | None = None  # chat with tools: answers may be calls
    return_text_in_logprobs: bool = False  # /generate: token text in the logprob entries
    return_spec_tokens_details: bool = False  # OpenAI routes: fill sglext
    model: str | None = None


# ---------------------------------------------------------------- field checks


def parse_json(body: bytes) -> dict[str, Any]:
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BadRequest(f"malformed JSON body: {exc}") from exc
    if not isinstance(data, dict):
        raise BadRequest("the request body must be a JSON object")
    return data


def _get(obj: dict[str, Any], key: str, kind: type, default: Any = None, where: str = "") -> Any:
    """obj[key] checked against kind (bool is not an int; an int is a float)."""
    value = obj.get(key)
    if value is None:
        return default
    ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        ok, value = True, float(value)
    if not ok:
        raise BadRequest(
            f"{where}{key} must be of type {kind.__name__}, got {type(value).__name__}")
    return value


def _int_list(value: Any, name: str) -> list[int]:
    if not isinstance(value, list) or not all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        raise BadRequest(f"{name} must be a list of integers")
    return value


def _stop_list(value: Any, name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise BadRequest(f"{name} must be a string or a list of strings")


def _refuse_unsupported(obj: dict[str, Any], where: str) -> None:
    if obj.get("structural_tag") is not None:
        raise BadRequest(f"{where}structural_tag is not supported by this engine")
    for name, off in UNSUPPORTED_DEFAULTS.items():
        if obj.get(name) is not None and obj[name] != off:
            raise BadRequest(f"{where}{name} is not supported by this engine")


def _constraint(obj: dict[str, Any], where: str) -> Constraint | None:
    """SGLang's json_schema / regex / ebnf (strings); at most one."""
    given = [name for name in GRAMMAR_FIELDS if obj.get(name) is not None]
    if len(given) > 1:
        raise BadRequest(f"only one of {where}json_schema, regex, ebnf may be given")
    if not given:
        return None
    value = obj[given[0]]
    if given[0] == "json_schema" and isinstance(value, dict):
        value = orjson.dumps(value).decode()
    if not isinstance(value, str) or not value:
        raise BadRequest(f"{where}{given[0]} must be a non-empty string")
    return Constraint(given[0], value)  # type: ignore[arg-type]


def _logit_bias(raw: Any, where: str) -> dict[int, float]:
    """OpenAI/SGLang logit_bias: {"token id": bias}, bias in [-100, 100]."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}logit_bias must be an object of token id -> bias")
    bias: dict[int, float] = {}
    for key, value in raw.items():
        # ASCII digits only: str.isdigit also accepts "²" (int() refuses it: a 500) and
        # other scripts' digits (int() reads them as another token id)
        if not (isinstance(key, str) and key.isascii() and key.isdigit()) \
                or isinstance(value, bool) \
                or not isinstance(value, int | float) or not -100 <= value <= 100:
            raise BadRequest(f"{where}logit_bias must map token ids to numbers in "
                             f"[-100, 100], got {key!r}: {value!r}")
        bias[int(key)] = float(value)
    return bias


def _custom_params(raw: Any, where: str) -> tuple[str | None, int | None]:
    """custom_params.method and custom_params.num_speculative_tokens."""
    if raw is None:
        return None, None
    if not isinstance(raw, dict):
        raise BadRequest(f"{where}custom_params must be an object")
    method = _get(raw, "method", str, where=f"{where}custom_params.")
    k = _get(raw, "num_speculative_tokens", int, where=f"{where}custom_params.")
    if k is not None and k < 0:
        raise BadRequest(f"{where}custom_params.num_speculative_tokens must be >= 0")
    return method, k


def parse_sampling(raw: dict[str, Any], where: str, max_tokens_key: str = "max_new_tokens",
                   default_max: int | None = 128, seed_key: str = "sampling_seed",
                   constraint: Constraint | None = None,
                   top_logprobs: int | None = None) -> SamplingParams:
    _refuse_unsupported(raw, where)
    max_new = _get(raw, max_tokens_key, int, default_max, where)
    if max_new is not None and max_new < 1:
        raise BadRequest(f"{where}{max_tokens_key} must be >= 1")
    temperature = _get(raw, "temperature", float, 1.0, where)
    if temperature < 0:
        raise BadRequest(f"{where}temperature must be >= 0")
    top_p = _get(raw, "top_p", float, 1.0, where)
    if not 0 < top_p <= 1:
        raise BadRequest(f"{where}top_p must be in (0, 1]")
    top_k = _get(raw, "top_k", int, -1, where)
    if top_k < -1:
        raise BadRequest(f"{where}top_k must be -1 (off) or >= 1")
    stop_ids = raw.get("stop_token_ids")
    return SamplingParams(
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=top_p,
        top_k=0 if top_k in (-1, 0) or top_k >= TOP_K_ALL else top_k,
        stop=_stop_list(raw.get("stop"), f"{where}stop"),
        stop_token_ids=[] if stop_ids is None else _int_list(stop_ids, f"{where}stop_token_ids"),
        ignore_eos=_get(raw, "ignore_eos", bool, False, where),
        seed=_get(raw, seed_key, int, None, where),
        constraint=constraint or _constraint(raw, where),
        presence_penalty=_get(raw, "presence_penalty", float, 0.0, where),
        frequency_penalty=_get(raw, "frequency_penalty", float, 0.0, where),
        logit_bias=_logit_bias(raw.get("logit_bias"), where),
        top_logprobs=top_logprobs,
    )


def _prompt(text: Any, input_ids: Any, text_key: str) -> tuple[str | None, list[int] | None]:
    if text is not None and input_ids is not None:
        raise BadRequest(f"give either {text_key} or input_ids, not both")
    if isinstance(text, list) and len(text) == 1 and isinstance(text[0], str):
        text = text[0]
    if text is not None:
        if isinstance(text, list) and text and all(isinstance(t, int) for t in text):
            return None, _int_list(text, text_key)
        if isinstance(text, list):
            raise BadRequest("batch requests are not supported; send one prompt per request")
        if not isinstance(text, str):
            raise BadRequest(f"{text_key} must be a string")
        if not text:
            raise BadRequest(f"{text_key} is empty")
        return text, None
    if input_ids is None:
        raise BadRequest(f"either {text_key} or input_ids must be given")
    if isinstance(input_ids, list) and input_ids and isinstance(input_ids[0], list):
        raise BadRequest("batch requests are not supported; send one prompt per request")
    ids = _int_list(input_ids, "input_ids")
    if not ids:
        raise BadRequest("input_ids is empty")
    return None, ids


# ---------------------------------------------------------------- request parsers


def parse_generate(body: dict[str, Any]) -> GenerateRequest:
    """SGLang `/generate` (GenerateReqInput in managers/io_struct.py)."""
    text, input_ids = _prompt(body.get("text"), body.get("input_ids"), "text")
    if body.get("input_embeds") is not None:
        raise BadRequest("input_embeds is not supported by this engine")
    raw = body.get("sampling_params")
    raw = {} if raw is None else raw
    if isinstance(raw, list):
        raise BadRequest("batch requests are not supported; send one prompt per request")
    if not isinstance(raw, dict):
        raise BadRequest("sampling_params must be an object")
    method, k = _custom_params(raw.get("custom_params"), "sampling_params.")
    if _get(raw, "n", int, 1, "sampling_params.") != 1:
        raise BadRequest("sampling_params.n must be 1 on /generate; send n requests")
    rid = _get(body, "rid", str, None)
    if _get(body, "logprob_start_len", int, -1) != -1:
        raise BadRequest("logprob_start_len: prompt logprobs are not supported by "
                         "this engine; only -1")
    top = _get(body, "top_logprobs_num", int, 0)
    return GenerateRequest(
        text=text, input_ids=input_ids,
        sampling=parse_sampling(raw, "sampling_params.", top_logprobs=(
            top if _get(body, "return_logprob", bool, False) else None)),
        method=method, k=k,
        stream=_get(body, "stream", bool, False),
        return_text_in_logprobs=_get(body, "return_text_in_logprobs", bool, False),
        **({"rid": rid} if rid else {}),
    )


def _response_format(body: dict[str, Any]) -> Constraint | None:
    """OpenAI response_format: json_object (any object) or json_schema (its schema)."""
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or fmt.get("type") not in RESPONSE_FORMATS:
        raise BadRequest("response_format.type must be text, json_object or json_schema")
    if fmt["type"] == "json_object":
        return Constraint("json_schema", JSON_OBJECT_SCHEMA)
    if fmt["type"] == "json_schema":
        spec = fmt.get("json_schema")
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if schema is None:
            return Constraint("json_schema", JSON_OBJECT_SCHEMA)
        if not isinstance(schema, dict):
            raise BadRequest("response_format.json_schema.schema must be an object")
        return Constraint("json_schema", orjson.dumps(schema).decode())
    return None


def _openai_logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """Chat: logprobs (bool) + top_logprobs (0..20); completions: logprobs (0..5)."""
    if chat:
        if not _get(body, "logprobs", bool, False):
            if body.get("top_logprobs"):
                raise BadRequest("top_logprobs needs logprobs: true")
            return None
        return _get(body, "top_logprobs", int, 0)
    top = _get(body, "logprobs", int, None)
    if top is not None and not 0 <= top <= 5:
        raise BadRequest("logprobs must be in 0..5")
    return top


def _openai_common(body: dict[str, Any], default_max: int | None, max_key: str,
                   chat: bool, tool_request: tools.ToolRequest | None = None) -> dict[str, Any]:
    if body.get("tools") and not chat:
        raise BadRequest("tools are for chat completions")
    options = body.get("stream_options") or {}
    if not isinstance(options, dict):
        raise BadRequest("stream_options must be an object")
    method, k = _custom_params(body.get("custom_params"), "")
    n = _get(body, "n", int, 1)
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"n must be in 1..{MAX_N}")
    constraint = _response_format(body)
    if constraint is not None and any(body.get(f) is not None for f in GRAMMAR_FIELDS):
        raise BadRequest("give either response_format or one of json_schema, regex, ebnf")
    tool_mode = tool_request.mode if tool_request is not None else None
    if tool_mode is not None:
        if constraint is not None or any(body.get(f) is not None for f in GRAMMAR_FIELDS):
            raise BadRequest("tools (tool_choice other than none) cannot be combined with "
                             "response_format or a grammar")
        constraint = tools.constraint(tool_request)  # type: ignore[arg-type]
    return dict(
        sampling=parse_sampling(body, "", max_tokens_key=max_key, default_max=default_max,
                                seed_key="seed", constraint=constraint,
                                top_logprobs=_openai_logprobs(body, chat)),
        method=method, k=k, n=n, tool_mode=tool_mode,
        stream=_get(body, "stream", bool, False),
        include_usage=_get(options, "include_usage", bool, False, "stream_options."),
        return_spec_tokens_details=_get(body, "return_spec_tokens_details", bool, False),
        model=_get(body, "model", str, None),
    )


def parse_completion(body: dict[str, Any]) -> GenerateRequest:
    """OpenAI `/v1/completions` (CompletionRequest in entrypoints/openai/protocol.py)."""
    text, input_ids = _prompt(body.get("prompt"), None, "prompt")
    if body.get("echo"):
        raise BadRequest("echo is not supported by this engine")
    return GenerateRequest(text=text, input_ids=input_ids,
                           **_openai_common(body, COMPLETIONS_DEFAULT_MAX_TOKENS, "max_tokens",
                                            chat=False))


def _message_text(content: Any, index: int) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise BadRequest(f"messages[{index}].content must be a string or a list of text parts")


def parse_chat(body: dict[str, Any], encode_chat: EncodeChat) -> GenerateRequest:
    """OpenAI `/v1/chat/completions`; the prompt is rendered with the model's template."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("messages must be a non-empty list")
    tool_request = tools.parse_tools(body)
    rendered = []
    for i, m in enumerate(messages):
        role = m.get("role") if isinstance(m, dict) else None
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise BadRequest(f"messages[{i}].role must be system, developer, user, assistant "
                             "or tool")
        if role == "assistant" and m.get("tool_calls"):
            content = (_message_text(m.get("content"), i) if m.get("content") else "") + \
                tools.call_text(m["tool_calls"], i)
        else:
            content = _message_text(m.get("content"), i)
        rendered.append({"role": "system" if role == "developer" else role,
                         "content": content})
    rendered = tools.render_messages(rendered, tool_request)
    max_key = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    return GenerateRequest(text=None, input_ids=encode_chat(rendered),
                           **_openai_common(body, None, max_key, chat=True,
                                            tool_request=tool_request))


def with_stop_ids(req: GenerateRequest, stop_ids: Sequence[int]) -> GenerateRequest:
    """The model's end tokens added to the request's stop ids (unless it ignores eos):
    an instruct model may end with end-of-text as well as its end-of-turn eos."""
    sampling = req.sampling
    if sampling.ignore_eos:
        return req
    extra = [i for i in stop_ids if i not in sampling.stop_token_ids]
    if not extra:
        return req
    return dataclasses.replace(req, sampling=dataclasses.replace(
        sampling, stop_token_ids=[*sampling.stop_token_ids, *extra]))
