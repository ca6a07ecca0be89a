"""Engine adapters: one per wire protocol, chosen by a pool's `engine`."""

from __future__ import annotations

import aiohttp

from gateway.upstream.adapters.base import Adapter
from gateway.upstream.adapters.openai import OpenAIAdapter
from gateway.upstream.adapters.sglang import SGLangAdapter


def make_adapters(session: aiohttp.ClientSession) -> dict[str, Adapter]:
    """Engine name → adapter. The embedded engine speaks SGLang's surface."""
    sglang = SGLangAdapter(session)
    openai = OpenAIAdapter(session)
    return {"sglang": sglang, "embedded": sglang, "vllm": openai, "openai": openai}
