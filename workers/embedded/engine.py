"""The embedded engine: per-request generations over one model, any method, any k.

`Engine.validate()` checks a request once and resolves its method and k (k = 0 means
plain decoding, whatever the method); `Engine.generate()` starts it and returns a
`Generation` (`start()` does both); each `step()` is one
blocking cycle (prefill and first token; then draft, verify, commit) and returns the
tokens and text it committed. Every method goes through the same `verify()`, so greedy
output equals plain greedy output and sampled output follows the target distribution
(see workers/embedded/speculative). Several generations may be stepped from one thread;
each owns its KV cache and drafter. Exceptions: `EngineInputError` (a bad request).
The types at the server seam live in `api` (torch-free).
"""

from __future__ import annotations

import dataclasses
import random
from pathlib import Path

import torch

from workers.embedded.api import (
    DecodeRequest,
    EngineInputError,
    GenerationStats,
    SamplingParams,
    StepOutput,
)
from workers.embedded.model import LlamaForCausalLM, load_model
from workers.embedded.speculative import DecodeState, Draft, Sampler, verify
from workers.embedded.speculative.methods import Method, builtin_methods, load_methods
from workers.embedded.tokenizer import TextTokenizer

BUNDLED_MODEL_DIR = Path(__file__).resolve().parent / "weights" / "specroute-tiny"


__all__ = [
    "BUNDLED_MODEL_DIR",
    "Engine",
    "EngineInputError",
    "Generation",
    "GenerationStats",
    "SamplingParams",
    "StepOutput",
]


class Engine:
    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_k: int = 16,
    ) -> None:
        folder = Path(model_dir) if model_dir is not None else BUNDLED_MODEL_DIR
        model = load_model(folder, dtype=dtype, device=device)
        tokenizer = TextTokenizer(folder / "tokenizer.json")
        self._setup(model, tokenizer, load_methods(folder, model), max_k)

    @classmethod
    def from_model(
        cls,
        model: LlamaForCausalLM,
        tokenizer: TextTokenizer,
        max_k: int = 16,
        methods: dict[str, Method] | None = None,
    ) -> Engine:
        """An engine over an in-memory model (tests, random tiny models)."""
        engine = cls.__new__(cls)
        engine._setup(model.eval(), tokenizer, methods or builtin_methods(), max_k)
        return engine

    def _setup(
        self,
        model: LlamaForCausalLM,
        tokenizer: TextTokenizer,
        methods: dict[str, Method],
        max_k: int,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.max_k = max_k
        self.max_context = model.config.max_position_embeddings
        self.eos_token_id = model.config.eos_token_id
        self._methods = methods
        self.methods = tuple(methods)
        self.default_k = {name: min(m.default_k, max_k) for name, m in methods.items()}

    def start(
        self,
        input_ids: list[int],
        params: SamplingParams,
        method: str = "plain",
        k: int | None = None,
    ) -> Generation:
        return self.generate(self.validate(input_ids, params, method, k))

    def validate(
        self,
        prompt: str | list[int],
        params: SamplingParams,
        method: str = "plain",
        k: int | None = None,
    ) -> DecodeRequest:
        """Check a request and resolve it: text is encoded, k = None takes the method's
        default, k = 0 means plain decoding, max_new_tokens = None the rest of the context."""
        if method not in self._methods:
            raise EngineInputError(
                f"unknown method {method!r}; this engine offers {', '.join(self.methods)}"
            )
        if k is None:
            k = self.default_k[method]
        if k == 0:
            method = "plain"
        k = self._check_k(method, k)
        input_ids = self.tokenizer.encode(prompt) if isinstance(prompt, str) else list(prompt)
        self._check_params(input_ids, params)
        if params.max_new_tokens is None:
            params = dataclasses.replace(params,
                                         max_new_tokens=self.max_context - len(input_ids))
        return DecodeRequest(input_ids, params, method, k)

    def generate(self, request: DecodeRequest) -> Generation:
        """Start a validated request (blocking work happens in its first `step()`)."""
        return Generation(self, request, self._methods[request.method])

    def set_default_k(self, method: str, k: int) -> None:
        """The k a request on `method` gets when it names none (a worker's `--k`)."""
        if method not in self._methods:
            raise EngineInputError(f"unknown method {method!r}")
        self.default_k[method] = 0 if k == 0 else self._check_k(method, k)

    def _check_k(self, method: str, k: int) -> int:
        if method == "plain":
            if k != 0:
                raise EngineInputError(f"k must be 0 or unset for plain decoding, got {k}")
            return 0
        if not 1 <= k <= self.max_k:
            raise EngineInputError(f"k must be in 1..{self.max_k} for {method}, got {k}")
        return k

    def _check_params(self, input_ids: list[int], params: SamplingParams) -> None:
        vocab = self.model.config.vocab_size
        if not input_ids:
            raise EngineInputError("the prompt is empty")
        if len(input_ids) >= self.max_context:  # SGLang's wording (tokenizer_manager.py)
            raise EngineInputError(
                f"The input ({len(input_ids)} tokens) is longer than the model's "
                f"context length ({self.max_context} tokens)."
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


class Generation:
    """One request's decoding loop; not thread-safe on its own (step it from one thread)."""

    def __init__(self, engine: Engine, request: DecodeRequest, method: Method) -> None:
        params, prompt = request.params, request.input_ids
        self._engine = engine
        self._model = engine.model
        self._max_new_tokens = request.max_new_tokens
        self._k = request.k
        self._drafter = method.new_drafter()
        self._cache = self._model.new_cache(max_length=engine.max_context)
        generator = torch.Generator(device=self._model.lm_head.weight.device)
        generator.manual_seed(
            params.seed if params.seed is not None else random.SystemRandom().getrandbits(63)
        )
        self._sampler = Sampler(params.temperature, params.top_p, params.top_k, generator)
        self._prompt = prompt
        self._state: DecodeState | None = None
        self._stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos and engine.eos_token_id is not None:
            self._stop_ids.add(engine.eos_token_id)
        self._text = _TextStream(engine.tokenizer, params.stop)
        self.output_ids: list[int] = []
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.finished = False
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None

    def step(self) -> StepOutput:
        if self.finished:
            return StepOutput([], "", True, self.finish_reason, self.matched_stop)
        with torch.inference_mode():
            new_tokens = self._prefill() if self._state is None else self._decode()
        return self._commit(new_tokens)

    def cancel(self) -> None:
        """Stop early and free the KV cache; later steps return finished outputs."""
        self.finished = True
        self._cache = None  # type: ignore[assignment]

    def _prefill(self) -> list[int]:
        device = self._model.lm_head.weight.device
        out = self._model(torch.tensor([self._prompt], device=device), self._cache, last_only=True)
        self._cache.commit()
        last = out.logits[0, -1]  # (V,)
        first = (
            int(last.argmax())
            if self._sampler.greedy
            else self._sampler.sample(self._sampler.probs(last))
        )
        self._state = DecodeState(
            tokens=[*self._prompt, first],
            prompt_len=len(self._prompt),
            k=self._k,
            sampler=self._sampler,
            hidden=out.hidden[0],
            hidden_start=0,
        )
        self.stats.verify_steps += 1
        return [first]

    def _decode(self) -> list[int]:
        state = self._state
        assert state is not None
        draft = self._fit(self._drafter.propose(state), state)
        root_position = self._cache.length
        result = verify(self._model, self._cache, state.tokens[-1], draft, self._sampler)
        state.tokens.extend(result.tokens)
        state.hidden, state.hidden_start, state.last = result.hidden, root_position, result
        self.stats.verify_steps += 1
        self.stats.num_proposed_drafts += result.num_proposed
        self.stats.num_correct_drafts += len(result.accepted)
        return result.tokens

    def _fit(self, draft: Draft, state: DecodeState) -> Draft:
        """Trim a draft to k nodes, to the tokens still allowed, and to the cache's room."""
        left_tokens = self._max_new_tokens - len(self.output_ids)
        left_context = self._engine.max_context - len(state.tokens)
        room = self._cache.max_length - self._cache.length - 1  # slots after the root
        if draft.aux is not None and len(draft.aux.tokens) + len(draft) > room:
            draft.aux = None
        max_depth = min(left_tokens, left_context) - 1
        return draft.prune(min(self._k, room), max_depth)

    def _commit(self, new_tokens: list[int]) -> StepOutput:
        reason: str | None = None
        matched: str | int | None = None
        left = self._max_new_tokens - len(self.output_ids)
        if len(new_tokens) >= left:  # drafts are pruned so this only trims, never overshoots
            new_tokens, reason = new_tokens[:left], "length"
        text_tokens = new_tokens
        for i, token in enumerate(new_tokens):
            if token in self._stop_ids:
                new_tokens, text_tokens = new_tokens[: i + 1], new_tokens[:i]
                reason, matched = "stop", token
                break
        start = len(self.output_ids)
        self.output_ids.extend(new_tokens)
        text, stop_at = self._text.push(text_tokens, final=reason is not None)
        if stop_at is not None:
            matched_text, token_count = stop_at
            reason, matched = "stop", matched_text
            del self.output_ids[start + token_count :]
            new_tokens = new_tokens[:token_count]
        if reason is None and self._prompt_len_plus_output() >= self._engine.max_context:
            reason = "length"
            text += self._text.flush()
        self.stats.completion_tokens = len(self.output_ids)
        if reason is not None:
            self.finished, self.finish_reason, self.matched_stop = True, reason, matched
            self._cache = None  # type: ignore[assignment]
        return StepOutput(new_tokens, text, self.finished, reason, matched)

    def _prompt_len_plus_output(self) -> int:
        return len(self._prompt) + len(self.output_ids)


class _TextStream:
    """Incremental detokenisation with text-level stop strings.

    Holds back a trailing incomplete UTF-8 sequence (decoded as U+FFFD) and any tail that
    could still grow into a stop string, so emitted text never has to be taken back.
    """

    def __init__(self, tokenizer: TextTokenizer, stops: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stops = stops
        self._ids: list[int] = []
        self._emitted = 0

    def push(self, ids: list[int], final: bool) -> tuple[str, tuple[str, int] | None]:
        """Add ids; return (text delta, (matched stop, ids of this push to keep) or None)."""
        before = len(self._ids)
        self._ids.extend(ids)
        full = self._tokenizer.decode(self._ids)
        hit = self._find_stop(full)
        if hit is not None:
            index, stop = hit
            keep = self._ids_through(before, stop)
            return self._emit(full[:index]), (stop, keep)
        if final:
            return self._emit(full), None
        safe = len(full.rstrip("\ufffd"))
        hold = 0
        for stop in self._stops:  # the longest tail that is a proper prefix of a stop string
            for n in range(min(len(stop) - 1, safe), hold, -1):
                if full[safe - n : safe] == stop[:n]:
                    hold = n
                    break
        safe -= hold
        return self._emit(full[:safe]), None

    def flush(self) -> str:
        return self._emit(self._tokenizer.decode(self._ids))

    def _find_stop(self, full: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = full.find(stop, max(0, self._emitted - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _ids_through(self, before: int, stop: str) -> int:
        """How many of the pushed ids it takes for the stop string to appear."""
        for n in range(1, len(self._ids) - before + 1):
            if (
                stop
                in self._tokenizer.decode(self._ids[: before + n])[
                    max(0, self._emitted - len(stop) + 1) :
                ]
            ):
                return n
        return len(self._ids) - before

    def _emit(self, text: str) -> str:
        delta = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return delta
