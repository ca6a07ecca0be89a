"""OpenAI tool calling on the embedded worker: tools in the prompt, calls under a grammar.

Neither model this worker ships has tools in its chat template (SmolLM2-135M-Instruct's
ChatML template renders role and content only), so the worker writes the convention of
the Hermes / Qwen2.5 templates into the conversation itself: a system message lists the
tools' JSON signatures between `<tools>` tags and asks for a call as
`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`; an assistant turn that made
calls is rendered the same way, and a `tool` message becomes a user turn holding
`<tool_response>...</tool_response>` (Qwen2.5's rendering of the tool role).

The call is generated under a grammar (llguidance Lark with an embedded JSON schema), so
it always parses and its arguments follow the tool's `parameters` schema:
- `tool_choice: "required"` or a named function: the answer IS one call;
- `"auto"`: either free text that does not start with `<`, or one call;
- `"none"` (or no tools): tools are listed but no grammar is imposed.
One call per answer (`parallel_tool_calls` is not offered).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from workers.embedded.api import Constraint
from workers.embedded.errors import BadRequest

OPEN, CLOSE = "<tool_call>", "</tool_call>"
ToolMode = Literal["auto", "forced"]
# JSON inside the call: fixed separators, no free whitespace (grammar.JSON_OPTIONS)
GUIDANCE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
SYSTEM = ("You can call functions to help with the user's request. Their signatures, one "
          "JSON object per line:\n<tools>\n{tools}\n</tools>\nTo call one, answer with "
          'exactly <tool_call>{{"name": <function name>, "arguments": <arguments as a JSON '
          "object>}}</tool_call> and nothing else.")


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]

    def signature(self) -> dict[str, Any]:
        return {"type": "function", "function": {"name": self.name,
                                                 "description": self.description,
                                                 "parameters": self.parameters}}

    def call_schema(self) -> dict[str, Any]:
        return {"type": "object", "properties": {"name": {"const": self.name},
                                                 "arguments": self.parameters},
                "required": ["name", "arguments"], "additionalProperties": False}


@dataclass(frozen=True)
class ToolRequest:
    tools: tuple[Tool, ...]
    mode: ToolMode | None  # None: tool_choice none
    forced: str | None = None  # the named function, when tool_choice names one


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """`tools` and `tool_choice` of a chat body; None when there are no tools."""
    raw = body.get("tools")
    if not raw:
        if body.get("tool_choice") not in (None, "none", "auto"):
            raise BadRequest("tool_choice needs tools")
        return None
    if not isinstance(raw, list):
        raise BadRequest("tools must be a list")
    tools = tuple(_tool(t, i) for i, t in enumerate(raw))
    names = [t.name for t in tools]
    if len(set(names)) != len(names):
        raise BadRequest("tools: function names must be unique")
    choice = body.get("tool_choice", "auto")
    if choice in (None, "auto"):
        return ToolRequest(tools, "auto")
    if choice == "none":
        return ToolRequest(tools, None)
    if choice == "required":
        return ToolRequest(tools, "forced")
    function = choice.get("function") if isinstance(choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not isinstance(name, str) or name not in names:
        raise BadRequest("tool_choice must be none, auto, required or "
                         '{"type": "function", "function": {"name": <one of tools>}}')
    return ToolRequest(tools, "forced", name)


def _tool(raw: Any, index: int) -> Tool:
    where = f"tools[{index}]"
    function = raw.get("function") if isinstance(raw, dict) else None
    if not isinstance(raw, dict) or raw.get("type") != "function" or not isinstance(function,
                                                                                  dict):
        raise BadRequest(f'{where} must be {{"type": "function", "function": {{...}}}}')
    name, parameters = function.get("name"), function.get("parameters", {"type": "object"})
    if not isinstance(name, str) or not name:
        raise BadRequest(f"{where}.function.name must be a non-empty string")
    if not isinstance(parameters, dict):
        raise BadRequest(f"{where}.function.parameters must be a JSON schema object")
    description = function.get("description") or ""
    return Tool(name, str(description), parameters)


def constraint(request: ToolRequest) -> Constraint | None:
    """The Lark grammar of the answer (see the module docstring)."""
    if request.mode is None:
        return None
    tools = [t for t in request.tools if request.forced in (None, t.name)]
    schema = {"anyOf": [t.call_schema() for t in tools], "x-guidance": GUIDANCE}
    call = f'call: "{OPEN}" body "{CLOSE}"\nbody: %json {json.dumps(schema)}\n'
    start = "start: call\n" if request.mode == "forced" else \
        "start: free | call\nfree: /[^<](.|\\n)*/\n"
    return Constraint("lark", start + call)


def render_messages(messages: Sequence[dict[str, str]],
                    request: ToolRequest | None) -> list[dict[str, str]]:
    """The conversation with the tools' system message (when there are tools) and tool
    results as user turns."""
    out: list[dict[str, str]] = []
    if request is not None:
        listing = "\n".join(json.dumps(t.signature()) for t in request.tools)
        out.append({"role": "system", "content": SYSTEM.format(tools=listing)})
    for i, m in enumerate(messages):
        if m["role"] == "system" and i == 0 and out:
            out[0]["content"] = m["content"] + "\n\n" + out[0]["content"]
        elif m["role"] == "tool":
            out.append({"role": "user",
                        "content": f"<tool_response>\n{m['content']}\n</tool_response>"})
        else:
            out.append({"role": m["role"], "content": m["content"]})
    return out


def call_text(tool_calls: Any, index: int) -> str:
    """An assistant message's `tool_calls` as the text the model would have written."""
    if not isinstance(tool_calls, list):
        raise BadRequest(f"messages[{index}].tool_calls must be a list")
    parts = []
    for call in tool_calls:
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise BadRequest(f"messages[{index}].tool_calls: each needs function.name")
        arguments = function.get("arguments") or "{}"
        try:
            parsed = json.loads(arguments) if isinstance(arguments, str) else arguments
        except json.JSONDecodeError as exc:
            raise BadRequest(f"messages[{index}].tool_calls: arguments must be JSON") from exc
        parts.append(OPEN + json.dumps({"name": function["name"], "arguments": parsed}) + CLOSE)
    return "".join(parts)


def parse_call(text: str) -> list[dict[str, Any]] | None:
    """OpenAI `tool_calls` from a generated answer; None when it is not a (whole) call."""
    if not (text.startswith(OPEN) and text.endswith(CLOSE)):
        return None
    try:
        call = json.loads(text[len(OPEN):-len(CLOSE)])
    except json.JSONDecodeError:
        return None
    return [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
             "function": {"name": call["name"],
                          "arguments": json.dumps(call["arguments"])}}]
