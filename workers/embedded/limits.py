"""What a request may ask of the engine: the checks `Engine.validate` runs on a request's
prompt and sampling parameters before it is admitted (the grammar itself is compiled,
and so checked, by the engine). Each failure is an `EngineInputError` naming the field."""

from __future__ import annotations

from workers.embedded.api import EngineInputError, SamplingParams

MAX_TOP_LOGPROBS = 20  # OpenAI's limit
MAX_PENALTY = 2.0  # OpenAI's and SGLang's range for presence and frequency penalties


def check_params(input_ids: list[int], params: SamplingParams, vocab: int,
                 max_context: int) -> None:
    if not input_ids:
        raise EngineInputError("the prompt is empty")
    if len(input_ids) >= max_context:  # SGLang's wording (tokenizer_manager.py)
        raise EngineInputError(
            f"The input ({len(input_ids)} tokens) is longer than the model's "
            f"context length ({max_context} tokens)."
        )
    if any(not 0 <= t < vocab for t in input_ids):
        raise EngineInputError(f"prompt token ids must be in 0..{vocab - 1}")
    if params.max_new_tokens is not None and params.max_new_tokens < 1:
        raise EngineInputError("max_new_tokens must be at least 1")
    if params.temperature < 0:
        raise EngineInputError("temperature must be >= 0")
    if not 0 < params.top_p <= 1:
        raise EngineInputError("top_p must be in (0, 1]")
    if params.top_k < 0:
        raise EngineInputError("top_k must be >= 0 (0 = off)")
    if any(not s for s in params.stop):
        raise EngineInputError("stop strings must be non-empty")
    for name in ("presence_penalty", "frequency_penalty"):
        if not -MAX_PENALTY <= getattr(params, name) <= MAX_PENALTY:
            raise EngineInputError(f"{name} must be in [-2, 2]")
    if any(not 0 <= t < vocab for t in params.logit_bias):
        raise EngineInputError(f"logit_bias keys must be token ids in 0..{vocab - 1}")
    if params.top_logprobs is not None and not 0 <= params.top_logprobs <= MAX_TOP_LOGPROBS:
        raise EngineInputError(f"top_logprobs must be in 0..{MAX_TOP_LOGPROBS}")
    if params.constraint is not None and params.ignore_eos:
        raise EngineInputError("ignore_eos cannot be combined with a grammar "
                               "(json_schema, regex, ebnf): the grammar ends the output")
