"""The parts of a request the classifier reads: the system text, the last user message,
and how much else (earlier turns, system messages) the request carries."""

from __future__ import annotations

from gateway.schemas import GenerationRequest, content_text

SYSTEM_CHARS = 1024


def prompt_parts(request: GenerationRequest) -> tuple[str, str]:
    """(system text, last user text); token-id prompts have no text to read."""
    if request.messages is None:
        return "", request.prompt if isinstance(request.prompt, str) else ""
    system_parts: list[str] = []
    user = ""
    for message in request.messages:
        role = message["role"]
        if role in ("system", "developer"):
            system_parts.append(content_text(message.get("content"))[:SYSTEM_CHARS])
        elif role == "user":
            user = content_text(message.get("content"))
    if not user:
        user = content_text(request.messages[-1].get("content"))
    return "\n".join(system_parts)[:SYSTEM_CHARS], user


def context_chars(request: GenerationRequest, user: str) -> int:
    """Characters of system messages and earlier turns (material an answer may copy)."""
    if not request.messages or len(request.messages) == 1:
        return 0
    total = sum(len(content_text(m.get("content"))) for m in request.messages)
    return max(total - len(user), 0)
