"""Validation of OpenAI request bodies into one typed `GenerationRequest`.

Hand-written checks rather than pydantic models: the token path validates every
request, and a handful of isinstance checks cost microseconds while naming the bad
field exactly as the OpenAI API does (`param`). A field the gateway does not check is a
400 naming it (`gateway.forwarding`, the allowlist per route and engine).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from gateway.config import DEFAULT_SERVER, ServerConfig
from gateway.errors import InvalidRequest
from gateway.forwarding import check_content_parts, check_openai_body
from policies.request_limits import (
    COMPLETIONS_DEFAULT_MAX_TOKENS,
    GRAMMAR_FIELDS,
    MAX_N,
    RESPONSE_FORMATS,
)

Endpoint = Literal["chat", "completions"]
BYTES_PER_TOKEN = 4  # the gateway has no tokenizer: prompt size is estimated from bytes
TOKENS_PER_MESSAGE = 4  # chat-template overhead per message
ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
MAX_TOP_LOGPROBS = 20  # OpenAI's
TOOL_CHOICES = frozenset({"none", "auto", "required"})
# custom_params keys that choose what the embedded worker runs: the gateway's alone
STEERING_KEYS = ("method", "num_speculative_tokens")


@dataclass(slots=True)
class GenerationRequest:
    endpoint: Endpoint
    model: str
    body: dict  # the client's body (known fields only), for the OpenAI adapters
    messages: list[dict] | None = None
    prompt: str | list[int] | None = None  # text, or token ids
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    stream: bool = False
    include_usage: bool = False
    response_format: dict | None = None
    tools: list | None = None
    tool_choice: Any = None
    user: str | None = None
    n: int = 1
    logprobs: bool = False  # logprobs asked for (chat: logprobs true; completions: an int)
    native: dict | None = None  # an SGLang /generate body (gateway.http.sglang_routes), sent as it is

    @property
    def needs_constrained(self) -> bool:
        """json_schema is a hard requirement: only a constrained decoder can honour it."""
        fmt = self.response_format
        return fmt is not None and fmt.get("type") == "json_schema"

    @property
    def wants_json_object(self) -> bool:
        """json_object is a preference: served unenforced when no pool can enforce it."""
        fmt = self.response_format
        return fmt is not None and fmt.get("type") == "json_object"

    @property
    def needs_tools(self) -> bool:
        return bool(self.tools) and self.tool_choice != "none"

    @property
    def json_schema(self) -> dict | None:
        """The schema a constrained decoder must follow, if the client gave one."""
        fmt = self.response_format
        if fmt is None or fmt.get("type") != "json_schema":
            return None
        spec = fmt.get("json_schema") or {}
        return spec.get("schema") if isinstance(spec, dict) else None

    @property
    def prompt_tokens_estimate(self) -> int:
        """UTF-8 bytes / 4 (rounded up) + 4 per message; token ids count as they are."""
        if isinstance(self.prompt, list):
            return len(self.prompt)
        if self.prompt is not None:
            return -(-len(self.prompt.encode("utf-8")) // BYTES_PER_TOKEN)
        messages = self.messages or []
        size = sum(len(content_text(m.get("content")).encode("utf-8")) for m in messages)
        return -(-size // BYTES_PER_TOKEN) + TOKENS_PER_MESSAGE * len(messages)


def content_text(content: object) -> str:
    """A message's text: a string, or the text parts of a content-part list."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(part["text"] for part in content
                         if isinstance(part, dict) and isinstance(part.get("text"), str))
    return ""


def _bad(param: str, message: str) -> InvalidRequest:
    return InvalidRequest(message, param=param, code="invalid_value")


def _number(body: dict, name: str, low: float, high: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise _bad(name, f"'{name}' must be a number, got {type(value).__name__}")
    if not low <= value <= high:
        raise _bad(name, f"'{name}' must be between {low:g} and {high:g}, got {value}")
    return float(value)


def _integer(body: dict, name: str, low: int, high: int = 2**63 - 1) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _bad(name, f"'{name}' must be an integer, got {type(value).__name__}")
    if value < low:
        raise _bad(name, f"'{name}' must be >= {low}, got {value}")
    if value > high:  # a 64-bit field upstream; orjson reads up to 2**64 - 1
        raise _bad(name, f"'{name}' must be <= {high}, got {value}")
    return value


def _top_p(body: dict) -> float | None:
    """(0, 1]: SGLang and vLLM both refuse 0 (sampling_params.py), so the gateway does."""
    value = _number(body, "top_p", 0.0, 1.0)
    if value == 0.0:
        raise _bad("top_p", "'top_p' must be > 0 and <= 1 (1e-9 is all but greedy)")
    return value


def _stop(body: dict) -> list[str] | None:
    value = body.get("stop")
    if value is None:
        return None
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(s, str) for s in value) and len(value) <= 4:
        return value
    raise _bad("stop", "'stop' must be a string or a list of at most 4 strings")


def _content_ok(content: Any) -> bool:
    if content is None or isinstance(content, str):
        return True
    return isinstance(content, list) and all(
        isinstance(p, dict) and isinstance(p.get("type"), str)
        and (p.get("text") is None or isinstance(p["text"], str)) for p in content)


def _messages(body: dict) -> list[dict]:
    messages = body.get("messages")
    if not isinstance(messages, list):
        raise _bad("messages", "'messages' is required and must be a list")
    if not messages:
        raise _bad("messages", "'messages' must contain at least one message")
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(param, f"'{param}' must be an object")
        role = message.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise _bad(f"{param}.role", f"'{param}.role' must be one of "
                       f"{', '.join(sorted(ROLES))}, got {role!r}")
        if not _content_ok(message.get("content")):
            raise _bad(f"{param}.content",
                       f"'{param}.content' must be a string or a list of content parts")
        if message.get("content") is None and role != "assistant":
            raise _bad(f"{param}.content", f"'{param}.content' is required")
    return messages


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and 0 <= t < 2**31
                    for t in prompt)):
        return prompt
    raise _bad("prompt", "'prompt' is required and must be a string, a list with one "
               "string, or a list of token ids (0..2**31-1)")


def _response_format(body: dict) -> dict | None:
    fmt = body.get("response_format")
    if fmt is None:
        return None
    if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str) \
            or fmt["type"] not in RESPONSE_FORMATS:
        raise _bad("response_format", "'response_format.type' must be one of "
                   "text, json_object, json_schema")
    if fmt["type"] == "json_schema" and not isinstance(fmt.get("json_schema"), dict):
        raise _bad("response_format", "'response_format.json_schema' must be an object")
    return fmt


def _stream_flags(body: dict) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise _bad("stream", "'stream' must be a boolean")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise _bad("stream_options", "'stream_options' must be an object")
    usage = options.get("include_usage", False)
    if usage is not None and not isinstance(usage, bool):
        raise _bad("stream_options.include_usage",
                   "'stream_options.include_usage' must be a boolean")
    return stream, bool(usage)


def check_custom_params(params: dict, param: str = "custom_params") -> None:
    """`custom_params` is an object (the adapters merge the gateway's k into it) without
    the keys that choose the worker's method or k (`STEERING_KEYS`): the gateway decides
    those and records them; a client that could set them would run one thing while the
    shared telemetry learned another, and would get around `may_pin`."""
    value = params.get("custom_params")
    if value is None:
        return
    if not isinstance(value, dict):
        raise _bad(param, f"'{param}' must be an object")
    for key in STEERING_KEYS:
        if key in value:
            raise InvalidRequest(
                f"'{param}.{key}' is set by the gateway, never by the client; to run a "
                f"given pool or k, send x-specroute-pool / x-specroute-k (API keys with "
                f"may_pin)", param=f"{param}.{key}", code="unsupported_parameter")


def check_grammar(params: dict, prefix: str = "") -> None:
    """SGLang's grammar fields, passed on to the worker: `json_schema` text (or, on the
    OpenAI routes, an object), `regex` and `ebnf` text."""
    given = [name for name in GRAMMAR_FIELDS if params.get(name) is not None]
    if len(given) > 1:
        raise _bad(prefix + given[1], f"give at most one of {prefix}json_schema, "
                   f"{prefix}regex, {prefix}ebnf")
    if given and not prefix and params.get("response_format") is not None:
        raise _bad(given[0], f"give either response_format or '{given[0]}', not both")
    for name in GRAMMAR_FIELDS:
        value = params.get(name)
        if value is None or isinstance(value, str) or (
                name == "json_schema" and not prefix and isinstance(value, dict)):
            continue
        kind = "a string or an object" if name == "json_schema" and not prefix else "a string"
        raise _bad(prefix + name, f"'{prefix}{name}' must be {kind}")


def _extensions(body: dict) -> None:
    """Fields beyond OpenAI's that the gateway or its adapters read (SGLang's sampling
    extensions): a wrong type is a 400 here, not a TypeError in an adapter."""
    check_custom_params(body)
    check_grammar(body)
    _integer(body, "top_k", -1)
    choice = body.get("tool_choice")
    if choice is not None and not isinstance(choice, dict) and not (
            isinstance(choice, str) and choice in TOOL_CHOICES):
        raise _bad("tool_choice", "'tool_choice' must be none, auto, required or an object "
                   "naming a function")
    tools = body.get("tools")
    if tools is None:
        return
    if not isinstance(tools, list):
        raise _bad("tools", "'tools' must be a list of objects")
    for i, tool in enumerate(tools):  # OpenAI's: {"type": "function", "function": {...}}
        function = tool.get("function") if isinstance(tool, dict) else None
        if isinstance(tool, dict) and tool.get("type", "function") != "function":
            raise _bad(f"tools[{i}].type", f"'tools[{i}].type' must be 'function'")
        if not isinstance(function, dict) or not isinstance(function.get("name"), str) \
                or not function["name"]:
            raise _bad(f"tools[{i}].function", f"'tools[{i}].function' must be an object "
                       "with a non-empty 'name'")
        if function.get("parameters") is not None and not isinstance(function["parameters"],
                                                                     dict):
            raise _bad(f"tools[{i}].function.parameters",
                       f"'tools[{i}].function.parameters' must be an object")


def parse_request(body: Any, endpoint: Endpoint,
                  server: ServerConfig = DEFAULT_SERVER) -> GenerationRequest:
    """Check an OpenAI chat/completions body; raise `InvalidRequest` naming the field.
    `server` gives the work limit (`check_work`) and the `max_tokens` of a request that
    sets none."""
    if not isinstance(body, dict):
        raise _bad("body", "the request body must be a JSON object")
    check_openai_body(body, endpoint)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _bad("model", "'model' is required and must be a non-empty string")
    n = _integer(body, "n", 1, MAX_N) or 1
    logprobs, top = _logprobs(body, endpoint)
    for name in ("presence_penalty", "frequency_penalty"):
        _number(body, name, -2.0, 2.0)
    check_logit_bias(body)
    max_tokens = _integer(body, "max_completion_tokens", 1)
    if max_tokens is None:
        max_tokens = _integer(body, "max_tokens", 1)
    seed = _integer(body, "seed", -(2**63))
    tokens_field = "max_completion_tokens" if body.get("max_completion_tokens") is not None \
        else "max_tokens"
    check_work(server.max_request_work, n, max_tokens or (
        COMPLETIONS_DEFAULT_MAX_TOKENS if endpoint == "completions"
        else server.default_max_tokens),
        top, ("n", tokens_field, "logprobs" if endpoint == "completions" else "top_logprobs"))
    _extensions(body)
    tools = body.get("tools")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise _bad("user", "'user' must be a string")
    stream, include_usage = _stream_flags(body)
    return GenerationRequest(
        endpoint=endpoint,
        model=model,
        body=body,
        messages=_messages(body) if endpoint == "chat" else None,
        prompt=_prompt(body) if endpoint == "completions" else None,
        max_tokens=max_tokens,
        temperature=_number(body, "temperature", 0.0, 2.0),
        top_p=_top_p(body),
        stop=_stop(body),
        seed=seed,
        stream=stream,
        include_usage=include_usage,
        response_format=_response_format(body),
        tools=tools,
        tool_choice=body.get("tool_choice"),
        user=user,
        n=n,
        logprobs=logprobs,
    )


def _logprobs(body: dict, endpoint: Endpoint) -> tuple[bool, int]:
    """Whether logprobs are asked for, and how many alternatives per token. Chat:
    `logprobs` boolean, `top_logprobs` 0..20 (needs logprobs); completions: `logprobs`
    0..5."""
    if endpoint == "completions":
        count = _integer(body, "logprobs", 0, 5)
        return count is not None, count or 0
    value = body.get("logprobs")
    if value is not None and not isinstance(value, bool):
        raise _bad("logprobs", "'logprobs' must be a boolean")
    top = _integer(body, "top_logprobs", 0, MAX_TOP_LOGPROBS)
    if top and not value:
        raise _bad("top_logprobs", "'top_logprobs' needs 'logprobs': true")
    return bool(value), top or 0


def check_work(limit: int, n: int, max_tokens: int, logprobs: int,
               names: tuple[str, str, str]) -> None:
    """A request's work, `n × max_tokens × (1 + logprobs)` (`names` are its three fields
    as the client wrote them), within `server.max_request_work`: the tokens and logprob
    entries one request may have the worker produce and the gateway hold, parse and
    re-render. Within OpenAI's own limits alone, n 16 × 8,000 tokens × 20 top logprobs
    would be 2.7 M entries (~175 MB of JSON). The 400 names the field to lower: `n` when
    above 1, else the logprobs, else the tokens."""
    work = n * max_tokens * (1 + logprobs)
    if work <= limit:
        return
    param = names[0] if n > 1 else names[2] if logprobs else names[1]
    raise InvalidRequest(
        f"{names[0]} ({n}) × {names[1]} ({max_tokens}) × (1 + {names[2]} ({logprobs})) = "
        f"{work} is above this gateway's limit of {limit} per request; lower '{param}'",
        param=param, code="request_too_large")


def check_logit_bias(body: dict, param: str = "logit_bias") -> None:
    """Token ids as ASCII digit strings: `str.isdigit` also accepts '²' (which `int`
    refuses) and other scripts' digits (which `int` reads as another id)."""
    bias = body.get("logit_bias")
    if bias is None:
        return
    if not isinstance(bias, dict) or not all(
            isinstance(k, str) and k.isascii() and k.isdigit() and not isinstance(v, bool)
            and isinstance(v, int | float) and -100 <= v <= 100 for k, v in bias.items()):
        raise _bad(param, f"'{param}' must map token ids (strings of ASCII digits) to "
                   "numbers in [-100, 100]")


def parse_forwardable(body: Any, endpoint: Endpoint,
                      server: ServerConfig = DEFAULT_SERVER) -> GenerationRequest:
    """What a token route forwards: `parse_request`, then text content parts only."""
    request = parse_request(body, endpoint, server)
    check_content_parts(request.messages)
    return request
