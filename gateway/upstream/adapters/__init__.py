"""Engine adapters: one per wire protocol, chosen by a pool's `engine`."""

from __future__ import annotations

from gateway.upstream.adapters.base import Adapter
from gateway.upstream.adapters.openai import OpenAIAdapter
from gateway.upstream.adapters.sglang import SGLangAdapter
from gateway.upstream.http1 import Http1Client


def make_adapters(client: Http1Client) -> dict[str, Adapter]:
    """Engine name → adapter. The embedded engine speaks SGLang's surface."""
    sglang = SGLangAdapter(client)
    openai = OpenAIAdapter(client)
    return {"sglang": sglang, "embedded": sglang, "vllm": openai, "openai": openai}
