"""Which request body fields reach a worker: an allowlist per route and per engine.

A field the gateway does not read would reach the worker unread (issue 43): SGLang's
`return_hidden_states` (the model's activations in the answer), `custom_logit_processor`
(code the worker runs when started with `--enable-custom-logit-processor`), `rid` (one
id space for every tenant's requests on a worker), image URLs the worker would fetch.
So the gateway takes only what it validates (`gateway.schemas`,
`gateway.http.sglang_routes`): any other field is a 400 `unknown_parameter` naming it,
and the upstream body is built from the pool's engine's list (`forwarded`), so a field
meant for one engine (vLLM's `guided_regex`) never reaches another.
"""

from __future__ import annotations

from gateway.errors import InvalidRequest

# OpenAI's fields the gateway validates, on both routes (gateway/schemas.py)
OPENAI_FIELDS = frozenset({
    "model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "stop", "seed",
    "n", "presence_penalty", "frequency_penalty", "logit_bias", "stream", "stream_options",
    "response_format", "tools", "tool_choice", "user", "logprobs"})
ROUTE_FIELDS = {"chat": OPENAI_FIELDS | {"messages", "top_logprobs"},
                "completions": OPENAI_FIELDS | {"prompt"}}
# The engines' own extensions the gateway validates and routes on: SGLang's sampling
# extensions and grammars (the embedded worker speaks SGLang's surface), vLLM's guided
# decoding, both engines' `ignore_eos` (benchmarks). `custom_params` carries the
# gateway's k (its steering keys are refused); `return_spec_tokens_details` asks SGLang
# for the speculation counters (the gateway sets it itself).
SGLANG_EXTRAS = frozenset({"top_k", "ignore_eos", "json_schema", "regex", "ebnf",
                           "custom_params", "return_spec_tokens_details"})
ENGINE_EXTRAS = {"sglang": SGLANG_EXTRAS, "embedded": SGLANG_EXTRAS,
                 "vllm": frozenset({"top_k", "ignore_eos", "guided_json", "guided_regex",
                                    "guided_grammar"}),
                 "openai": frozenset()}
BOOLEAN_EXTRAS = ("ignore_eos", "return_spec_tokens_details")
ANY_ENGINE_EXTRAS = frozenset().union(*ENGINE_EXTRAS.values())
# SGLang's native `/generate` (GenerateReqInput and SamplingParams, sglang 0.5.23), as
# gateway/http/sglang_routes.py validates it; `rid` is checked and then replaced by the
# gateway's own (gateway/upstream/adapters/sglang.py).
NATIVE_FIELDS = frozenset({
    "text", "input_ids", "model", "stream", "rid", "sampling_params", "return_logprob",
    "top_logprobs_num", "token_ids_logprob", "logprob_start_len", "return_text_in_logprobs"})
SAMPLING_FIELDS = frozenset({
    "max_new_tokens", "temperature", "top_p", "top_k", "stop", "stop_token_ids",
    "ignore_eos", "sampling_seed", "n", "presence_penalty", "frequency_penalty",
    "logit_bias", "json_schema", "regex", "ebnf", "custom_params"})
CONTENT_PART_TYPES = frozenset({"text"})  # the served models read text only


def check_fields(body: dict, allowed: frozenset[str], prefix: str = "") -> None:
    """A 400 naming the first field of `body` outside `allowed`."""
    for name in body:
        if name not in allowed:
            raise InvalidRequest(f"Unknown parameter: '{prefix}{name}'. The gateway forwards "
                                 f"only the fields it checks (GET /openapi.json lists them)",
                                 param=prefix + str(name), code="unknown_parameter")


def check_openai_body(body: dict, endpoint: str) -> None:
    """The fields of a chat or completions body, and the types of vLLM's extras."""
    check_fields(body, ROUTE_FIELDS[endpoint] | ANY_ENGINE_EXTRAS)
    for name in ("guided_regex", "guided_grammar"):
        if body.get(name) is not None and not isinstance(body[name], str):
            raise InvalidRequest(f"'{name}' must be a string", param=name,
                                 code="invalid_value")
    for name in BOOLEAN_EXTRAS:
        if body.get(name) is not None and not isinstance(body[name], bool):
            raise InvalidRequest(f"'{name}' must be a boolean", param=name,
                                 code="invalid_value")
    if body.get("guided_json") is not None and not isinstance(body["guided_json"], str | dict):
        raise InvalidRequest("'guided_json' must be a string or an object",
                             param="guided_json", code="invalid_value")


def check_content_parts(messages: list[dict] | None) -> None:
    """Text parts only: an `image_url` part names a URL the worker would fetch."""
    for i, message in enumerate(messages or ()):
        parts = message.get("content")
        for j, part in enumerate(parts if isinstance(parts, list) else ()):
            if part["type"] not in CONTENT_PART_TYPES:  # a string (`gateway.schemas`)
                param = f"messages[{i}].content[{j}].type"
                raise InvalidRequest(f"'{param}' must be 'text' (the served models read "
                                     f"text only), got {part['type'][:40]!r}", param=param,
                                     code="unknown_parameter")


def check_native_body(body: dict) -> None:
    check_fields(body, NATIVE_FIELDS)
    params = body.get("sampling_params")
    if isinstance(params, dict):
        check_fields(params, SAMPLING_FIELDS, "sampling_params.")


def forwarded(body: dict, endpoint: str, engine: str) -> dict:
    """The body's fields that `engine`'s workers get (the client's values, unchanged)."""
    allowed = ROUTE_FIELDS[endpoint] | ENGINE_EXTRAS.get(engine, frozenset())
    return {name: value for name, value in body.items() if name in allowed}


def forwarded_native(body: dict) -> dict:
    """A native body's known fields, `model` left out (SGLang's request has none)."""
    out = {name: value for name, value in body.items()
           if name in NATIVE_FIELDS and name != "model"}
    params = body.get("sampling_params")
    if isinstance(params, dict):
        out["sampling_params"] = {name: value for name, value in params.items()
                                  if name in SAMPLING_FIELDS}
    return out
