"""The gateway's OpenAPI 3.0 document, served at `GET /openapi.json`.

Static and hand-written, like the validation it describes (`gateway.schemas`): every
route the app has (tests/e2e/test_gateway_fuzz.py checks the two lists are the same),
each request field the gateway reads with the bounds it enforces, and every error in
the one OpenAI shape (`gateway.errors`). No other body field is allowed
(`additionalProperties: false`): the gateway answers one with a 400 naming it
(`gateway.forwarding`). Generated answers are described loosely (the workers' own
fields pass through).
"""

from __future__ import annotations

from typing import Any

from gateway.schemas import MAX_TOP_LOGPROBS, STEERING_KEYS, TOOL_CHOICES
from policies.request_limits import MAX_K, MAX_N

ERROR_STATUSES = {
    "400": "Invalid request (the `param` names the field)",
    "401": "Missing or unknown API key",
    "403": "The tenant may not do this",
    "404": "Unknown model or route",
    "405": "Method not allowed",
    "408": "The body did not arrive within server.body_timeout_s",
    "413": "Body larger than server.max_body_bytes",
    "415": "Content-Type is not JSON",
    "429": "Rate limited (Retry-After)",
    "500": "A gateway bug, with a request id",
    "502": "Every worker tried failed",
    "503": "No available worker, or shutting down",
    "504": "A worker timed out",
}

ERROR = {
    "type": "object", "required": ["error"],
    "properties": {"error": {
        "type": "object", "required": ["message", "type", "code"],
        "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                       "param": {"type": "string", "nullable": True},
                       "code": {"type": "string", "nullable": True},
                       "request_id": {"type": "string"}}}},
}

ROLES = ["system", "developer", "user", "assistant", "tool", "function"]

COMMON_FIELDS: dict[str, Any] = {
    "model": {"type": "string", "minLength": 1},  # the served names (openapi_document)
    "max_tokens": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "max_completion_tokens": {"type": "integer", "minimum": 1, "maximum": 2**63 - 1},
    "temperature": {"type": "number", "minimum": 0, "maximum": 2},
    "top_p": {"type": "number", "minimum": 0, "exclusiveMinimum": True, "maximum": 1},
    "stop": {"oneOf": [{"type": "string"},
                       {"type": "array", "items": {"type": "string"}, "maxItems": 4}]},
    "seed": {"type": "integer", "minimum": -(2**63), "maximum": 2**63 - 1},
    "n": {"type": "integer", "minimum": 1, "maximum": MAX_N},
    "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2},
    "logit_bias": {"type": "object",  # keys: token ids as strings of digits
                   "additionalProperties": {"type": "number", "minimum": -100,
                                            "maximum": 100}},
    "stream": {"type": "boolean"},
    "stream_options": {"type": "object",
                       "properties": {"include_usage": {"type": "boolean"}}},
    # SGLang's extensions the gateway reads: custom_params carries the gateway's own k;
    # a client's method or num_speculative_tokens is refused (pin with the headers)
    "custom_params": {"type": "object", "not": {"anyOf": [
        {"required": [key]} for key in STEERING_KEYS]}},
    "top_k": {"type": "integer", "minimum": -1},
    "ignore_eos": {"type": "boolean"},
    "return_spec_tokens_details": {"type": "boolean"},
    "json_schema": {"oneOf": [{"type": "string"}, {"type": "object"}]},
    "regex": {"type": "string"},
    "ebnf": {"type": "string"},
    # vLLM's guided decoding (sent to vLLM pools only)
    "guided_json": {"oneOf": [{"type": "string"}, {"type": "object"}]},
    "guided_regex": {"type": "string"},
    "guided_grammar": {"type": "string"},
    "response_format": {
        "type": "object", "required": ["type"],
        "properties": {"type": {"type": "string",
                                "enum": ["text", "json_object", "json_schema"]},
                       "json_schema": {"type": "object"}}},
    "tools": {"type": "array", "items": {
        "type": "object", "required": ["function"],
        "properties": {"type": {"type": "string", "enum": ["function"]}, "function": {
            "type": "object", "required": ["name"],
            "properties": {"name": {"type": "string", "minLength": 1},
                           "description": {"type": "string"},
                           "parameters": {"type": "object"}}}}}},
    "tool_choice": {"oneOf": [{"type": "string", "enum": sorted(TOOL_CHOICES)},
                              {"type": "object"}]},
    "user": {"type": "string"},
}

CONTENT = {"oneOf": [
    {"type": "string"},
    {"type": "array", "items": {"type": "object", "required": ["type"],
                                "properties": {"type": {"type": "string"},
                                               "text": {"type": "string"}}}}]}

CHAT_REQUEST: dict[str, Any] = {
    "type": "object", "required": ["model", "messages"], "additionalProperties": False,
    "properties": {
        **COMMON_FIELDS,
        "logprobs": {"type": "boolean"},
        "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
        "messages": {"type": "array", "minItems": 1, "items": {"anyOf": [
            {"type": "object", "required": ["role", "content"],
             "properties": {"role": {"type": "string", "enum": [r for r in ROLES
                                                                if r != "assistant"]},
                            "content": CONTENT, "name": {"type": "string"}}},
            {"type": "object", "required": ["role"],  # content may be null (tool calls)
             "properties": {"role": {"type": "string", "enum": ["assistant"]},
                            "content": {**CONTENT, "nullable": True},
                            "name": {"type": "string"}}}]}},
    },
}

COMPLETIONS_REQUEST: dict[str, Any] = {
    "type": "object", "required": ["model", "prompt"], "additionalProperties": False,
    "properties": {
        **COMMON_FIELDS,
        "logprobs": {"type": "integer", "minimum": 0, "maximum": 5},
        "prompt": {"oneOf": [
            {"type": "string"},
            {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 1},
            {"type": "array", "minItems": 1,
             "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}}]},
    },
}

NATIVE_REQUEST: dict[str, Any] = {  # SGLang's GenerateReqInput, as gateway/http/sglang_routes.py reads it
    "type": "object", "additionalProperties": False,
    "oneOf": [{"required": ["text"], "not": {"required": ["input_ids"]}},
              {"required": ["input_ids"], "not": {"required": ["text"]}}],
    "properties": {
        "text": {"type": "string", "minLength": 1},
        "input_ids": {"type": "array", "minItems": 1,
                      "items": {"type": "integer", "minimum": 0, "maximum": 2**31 - 1}},
        "model": {"type": "string"},
        "stream": {"type": "boolean"},
        "rid": {"type": "string"},  # checked, then replaced by the gateway's own
        "return_logprob": {"type": "boolean"},
        "top_logprobs_num": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS},
        "token_ids_logprob": {"type": "array", "maxItems": MAX_TOP_LOGPROBS,
                              "items": {"type": "integer", "minimum": 0,
                                        "maximum": 2**31 - 1}},
        "logprob_start_len": {"type": "integer", "minimum": -1},
        "return_text_in_logprobs": {"type": "boolean"},
        "sampling_params": {"type": "object", "additionalProperties": False, "properties": {
            "max_new_tokens": {"type": "integer", "minimum": 0},
            "temperature": {"type": "number", "minimum": 0},
            "top_p": COMMON_FIELDS["top_p"],
            "top_k": COMMON_FIELDS["top_k"],
            "sampling_seed": {"type": "integer"},
            "stop": {"oneOf": [{"type": "string"},
                               {"type": "array", "items": {"type": "string"}}]},
            "logit_bias": COMMON_FIELDS["logit_bias"],
            "custom_params": COMMON_FIELDS["custom_params"],
            "json_schema": {"type": "string"}, "regex": {"type": "string"},
            "ebnf": {"type": "string"}, "n": {"type": "integer", "minimum": 1, "maximum": 1},
            "presence_penalty": COMMON_FIELDS["presence_penalty"],
            "frequency_penalty": COMMON_FIELDS["frequency_penalty"],
            "ignore_eos": {"type": "boolean"},
            "stop_token_ids": {"type": "array", "items": {
                "type": "integer", "minimum": 0, "maximum": 2**31 - 1}}}},
    },
}

PIN_HEADERS = [
    {"name": "x-specroute-pool", "in": "header", "required": False,
     "description": "Run on this pool (it must be eligible)", "schema": {"type": "string"}},
    {"name": "x-specroute-k", "in": "header", "required": False,
     "description": f"Speculative tokens, 0..{MAX_K} in ASCII digits (tenants with "
                    "may_pin)",
     "schema": {"type": "string", "pattern": "^({})$".format(
         "|".join(str(k) for k in range(MAX_K + 1)))}},
    {"name": "x-specroute-benchmark", "in": "header", "required": False,
     "description": "Mark the request as a benchmark (not learned from)",
     "schema": {"type": "string"}},
]


def _errors(*statuses: str) -> dict:
    return {status: {"description": ERROR_STATUSES[status],
                     "content": {"application/json": {"schema": {
                         "$ref": "#/components/schemas/Error"}}}}
            for status in statuses}


def _json(description: str, schema: dict | None = None) -> dict:
    return {"description": description,
            "content": {"application/json": {"schema": schema or {"type": "object"}}}}


def _generation(summary: str, schema_ref: str) -> dict:
    return {"summary": summary, "parameters": PIN_HEADERS,
            "requestBody": {"required": True, "content": {"application/json": {
                "schema": {"$ref": f"#/components/schemas/{schema_ref}"}}}},
            "responses": {"200": {"description": "The answer; an SSE stream when stream "
                                  "is true (errors after the first token are error events)",
                                  "content": {"application/json": {"schema": {
                                      "type": "object"}},
                                      "text/event-stream": {"schema": {"type": "string"}}}},
                          **_errors("400", "401", "403", "404", "408", "413", "415", "429",
                                    "502", "503", "504")}}


def _info(summary: str) -> dict:
    return {"get": {"security": [], "summary": summary,
                    "responses": {"200": _json(summary)}}}


def openapi_document(models: tuple[str, ...] = ()) -> dict:
    """The whole document (a fresh dict each call); `models`, the served model names, are
    the values `model` may take (any other is a 404 `model_not_found`)."""
    public: dict[str, Any] = {"security": []}
    model = {"type": "string", "enum": list(models)} if models else COMMON_FIELDS["model"]
    chat = {**CHAT_REQUEST, "properties": {**CHAT_REQUEST["properties"], "model": model}}
    completions = {**COMPLETIONS_REQUEST,
                   "properties": {**COMPLETIONS_REQUEST["properties"], "model": model}}
    return {
        "openapi": "3.0.3",
        "info": {"title": "specroute gateway", "version": "0.1.0",
                 "description": "OpenAI-compatible adaptive speculation gateway"},
        "security": [{"bearer": []}],
        "paths": {
            "/v1/chat/completions": {"post": _generation("OpenAI chat completion",
                                                         "ChatRequest")},
            "/v1/completions": {"post": _generation("OpenAI completion",
                                                    "CompletionsRequest")},
            "/v1/routing/explain": {"post": {
                "summary": "The routing decision for a chat or completions body, "
                           "without generating", "parameters": PIN_HEADERS,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {"oneOf": [{"$ref": "#/components/schemas/ChatRequest"},
                                         {"$ref": "#/components/schemas/CompletionsRequest"}
                                         ]}}}},
                "responses": {"200": _json("Profile, decision and candidates"),
                              **_errors("400", "401", "403", "408", "413", "415",
                                        "429", "503")}}},
            "/v1/models": {"get": {"summary": "Served models",
                                   "responses": {"200": _json("A list of models"),
                                                 **_errors("401")}}},
            "/v1/models/{model}": {"get": {
                "summary": "One served model",
                "parameters": [{"name": "model", "in": "path", "required": True,
                                "schema": model}],
                "responses": {"200": _json("The model"), **_errors("401", "404")}}},
            "/v1/routing/fleet": {"get": {
                "summary": "Current and desired fleet per model (admin)",
                "responses": {"200": _json("The fleet plan"), **_errors("401")}}},
            "/console": {"get": {
                "summary": "The operator console page (admin; docs/CONSOLE.md)",
                "responses": {"200": {"description": "HTML", "content": {"text/html": {
                    "schema": {"type": "string"}}}}, **_errors("401", "403")}}},
            "/console/{asset}": {"get": {
                **public, "summary": "The console's script or style sheet",
                "parameters": [{"name": "asset", "in": "path", "required": True,
                                "schema": {"type": "string",
                                           "enum": ["console.js", "console.css"]}}],
                "responses": {"200": {"description": "JavaScript or CSS"}, **_errors("404")}}},
            "/v1/console/state": {"get": {
                "summary": "What the console draws: routing table, pools, tenants, fleet, "
                           "decisions (admin)",
                "responses": {"200": _json("The console's state"), **_errors("401", "403")}}},
            "/generate": {"post": {
                "summary": "SGLang's native generate (gateway/http/sglang_routes.py): text or input_ids",
                "parameters": PIN_HEADERS,
                "requestBody": {"required": True, "content": {"application/json": {
                    "schema": {**NATIVE_REQUEST, "properties": {
                        **NATIVE_REQUEST["properties"], "model": model}}}}},
                "responses": {"200": {"description": "SGLang's answer (an SSE stream of "
                                      "cumulative chunks when stream is true)",
                                      "content": {"application/json": {"schema": {
                                          "type": "object"}},
                                          "text/event-stream": {"schema": {"type": "string"}}}},
                              **_errors("400", "401", "403", "404", "408", "413", "415", "429",
                                        "502", "503", "504")}}},
            "/server_info": _info("SGLang-style server info: pools and live workers' state"),
            "/get_server_info": _info("Same as /server_info"),
            "/model_info": _info("SGLang-style model info"),
            "/get_model_info": _info("Same as /model_info"),
            "/health_generate": {"get": {**public, "summary": "200 when a pool can generate",
                                         "responses": {"200": {"description": "ok"},
                                                       **_errors("503")}}},
            "/health": {"get": {**public, "summary": "200 while the process runs",
                                "responses": {"200": _json("ok")}}},
            "/ready": {"get": {**public, "summary": "200 when every model has an available "
                               "worker (detail for an admin)",
                               "responses": {"200": _json("Ready"),
                                             "503": _json("Not ready")}}},
            "/metrics": {"get": {"summary": "Prometheus metrics (admin key when configured)",
                                 "responses": {"200": {"description": "Prometheus text",
                                                       "content": {"text/plain": {
                                                           "schema": {"type": "string"}}}},
                                               **_errors("401")}}},
            "/openapi.json": {"get": {**public, "summary": "This document",
                                      "responses": {"200": _json("OpenAPI 3.0")}}},
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": ERROR, "ChatRequest": chat,
                        "CompletionsRequest": completions},
        },
    }
