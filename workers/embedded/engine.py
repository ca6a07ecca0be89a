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
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from policies.request_limits import MAX_K
from workers.embedded.api import (
    DecodeRequest,
    EngineInputError,
    GenerationStats,
    RunningGeneration,
    SamplingParams,
    SourceTally,
    StepOutput,
)
from workers.embedded.checkpoint import load_model
from workers.embedded.detokenize import TextStream
from workers.embedded.grammar import GrammarCompiler, GrammarProcessor
from workers.embedded.limits import check_params
from workers.embedded.model import ForwardOutput, LlamaForCausalLM, SequenceInput
from workers.embedded.speculative import DecodeState, Draft, Sampler
from workers.embedded.speculative.lockstep import DraftSteps, draft_together
from workers.embedded.speculative.methods import EngineMethod, builtin_methods, load_methods
from workers.embedded.speculative.processors import build_processors
from workers.embedded.speculative.sampling import token_logprobs
from workers.embedded.speculative.verify import VerifyStep
from workers.embedded.tokenizer import TextTokenizer
from workers.models import BUNDLED_MODEL_DIR

# Prompt tokens prefilled per engine step: a long prompt is prefilled over several steps,
# each sharing its forward with the other requests' decode steps, so a 6,000-token prompt
# does not stall them for its whole prefill (chunked prefill: Sarathi, arXiv 2308.16369;
# SGLang --chunked-prefill-size, vLLM --enable-chunked-prefill). 512 keeps a step of
# SmolLM2 on this CPU around a second.
PREFILL_CHUNK = 512

__all__ = ["BUNDLED_MODEL_DIR", "Engine", "EngineInputError", "Generation", "GenerationStats",
           "SamplingParams", "StepOutput"]


class Engine:
    def __init__(
        self,
        model_dir: str | Path | None = None,
        device: str = "cpu",
        dtype: torch.dtype = torch.float32,
        max_k: int = MAX_K,
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
        max_k: int = MAX_K,
        methods: dict[str, EngineMethod] | None = None,
    ) -> Engine:
        """An engine over an in-memory model (tests, random tiny models)."""
        engine = cls.__new__(cls)
        engine._setup(model.eval(), tokenizer, methods or builtin_methods(), max_k)
        return engine

    def _setup(
        self,
        model: LlamaForCausalLM,
        tokenizer: TextTokenizer,
        methods: dict[str, EngineMethod],
        max_k: int,
    ) -> None:
        self.model = model.fuse()  # fused projections (inference; see model.Attention)
        self.tokenizer = tokenizer
        self.max_k = max_k
        self.max_context = model.config.max_position_embeddings
        self.eos_token_id = model.config.eos_token_id
        self._methods = methods
        self.methods = tuple(methods)
        self.default_k = {name: min(m.default_k, max_k) for name, m in methods.items()}
        self.grammars = GrammarCompiler(tokenizer.path, tokenizer.stop_ids,
                                        model.config.vocab_size)
        self.prefill_chunk = PREFILL_CHUNK

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

    def step(self, generations: Sequence[RunningGeneration]) -> list[StepOutput | Exception]:
        """One step of every generation given, sharing ONE target forward.

        Each generation contributes its prompt (prefill) or its root + draft tree, proposed
        by its own drafter with its own k; `LlamaForCausalLM.forward_batch` runs them all
        as one ragged batch, and each accepts on its own rows and KV cache. So N requests
        verifying k tokens each cost one forward over N * (k + 1) tokens, as on a GPU
        server (SGLang's and vLLM's schedulers batch every running request's decode or
        verify step the same way). A generation whose step fails gets its exception in
        its slot and is cancelled; the others go on. Finished ones return a finished
        output. Each decode step adds the forward's size and draft tokens to the
        generation's stats (`GenerationStats.add_batch_step`).
        """
        own = [g for g in generations if isinstance(g, Generation)]
        if len(own) != len(generations):
            raise TypeError("Engine.step takes the Generations this engine started")
        results: list[StepOutput | Exception] = [g._finished_output() for g in own]
        running: list[tuple[int, SequenceInput]] = []
        chains: dict[int, DraftSteps] = {}  # drafted in lock-step
        with torch.inference_mode():
            for i, gen in enumerate(own):
                if not gen.finished:
                    try:
                        work = gen._prepare()
                        if isinstance(work, SequenceInput):
                            running.append((i, work))
                        else:
                            chains[i] = work
                    except Exception as exc:  # this request's drafter or limits
                        results[i] = gen._fail(exc)
            for i, draft in draft_together(chains).items():
                try:
                    if isinstance(draft, Exception):
                        raise draft
                    running.append((i, own[i]._verify_input(draft)))
                except Exception as exc:
                    results[i] = own[i]._fail(exc)
            running.sort(key=lambda item: item[0])
            outputs = self.model.forward_each([item for _, item in running])
            size = len(running)
            drafts = sum(own[i]._draft_tokens() for i, _ in running)
            for (i, _), out in zip(running, outputs, strict=True):
                gen = own[i]
                try:
                    if isinstance(out, Exception):
                        raise out
                    if gen._verify is not None:  # a decode step (not prefill): see api
                        gen.stats.add_batch_step(size, drafts)
                    results[i] = gen._complete(out)
                except Exception as exc:
                    results[i] = gen._fail(exc)
        return results

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
        check_params(input_ids, params, self.model.config.vocab_size, self.max_context)
        if params.constraint is not None:
            self.grammars.compile(params.constraint)  # EngineInputError if invalid


class Generation:
    """One request's decoding loop; not thread-safe on its own (step it from one thread)."""

    def __init__(self, engine: Engine, request: DecodeRequest, method: EngineMethod) -> None:
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
        device = self._model.lm_head.weight.device
        self._grammar: GrammarProcessor | None = None
        if params.constraint is not None:
            self._grammar = engine.grammars.processor(params.constraint, device)
        self._processor = build_processors(params, self._model.config.vocab_size, device,
                                           self._grammar)
        self._top_logprobs = params.top_logprobs
        self._prompt = prompt
        self._prefilled: list[torch.Tensor] = []  # (chunk, C) hidden of each prefilled chunk
        self._chunk = 0  # prompt tokens in the chunk being prefilled
        self._state: DecodeState | None = None
        self._verify: VerifyStep | None = None  # the step prepared for the next forward
        self._stop_ids = set(params.stop_token_ids)
        if not params.ignore_eos and engine.eos_token_id is not None:
            self._stop_ids.add(engine.eos_token_id)
        self._text = TextStream(engine.tokenizer, params.stop)
        self.output_ids: list[int] = []
        self.stats = GenerationStats(prompt_tokens=len(prompt))
        self.finished = False
        self.finish_reason: str | None = None
        self.matched_stop: str | int | None = None

    def step(self) -> StepOutput:
        """One step of this generation alone (`Engine.step` batches several)."""
        result = self._engine.step([self])[0]
        if isinstance(result, Exception):
            raise result
        return result

    def cancel(self) -> None:
        """Stop early and free the KV cache; later steps return finished outputs."""
        self.finished = True
        self._cache = None  # type: ignore[assignment]

    def _finished_output(self) -> StepOutput:
        return StepOutput([], "", True, self.finish_reason, self.matched_stop)

    def _fail(self, exc: Exception) -> Exception:
        self.cancel()
        return exc

    def _prepare(self) -> SequenceInput | DraftSteps:
        """This step's share of the batched forward: the prompt, or root + draft tree; or,
        for a drafter that drafts in lock-step with others (EAGLE, Medusa), its steps,
        whose draft `_verify_input` takes."""
        state = self._state
        if state is None:
            done = self._cache.length
            chunk = self._prompt[done: done + self._engine.prefill_chunk]
            self._chunk = len(chunk)
            return SequenceInput(torch.tensor(chunk, device=self._model.lm_head.weight.device),
                                 self._cache, last_only=True)
        steps = getattr(self._drafter, "propose_steps", None)
        if steps is not None:
            return steps(state)
        return self._verify_input(self._drafter.propose(state))

    def _verify_input(self, draft: Draft) -> SequenceInput:
        state = self._state
        assert state is not None, "drafted after the prompt"
        draft = self._fit(draft, state)
        if self._grammar is not None:
            draft = self._grammar.prune(draft)
        self._verify = VerifyStep(self._cache, state.tokens[-1], draft,
                                  self._model.lm_head.weight.device)
        return self._verify.input

    def _draft_tokens(self) -> int:
        """Draft tokens in this step's prepared forward: 0 for prefill and plain decoding."""
        return len(self._verify.draft) if self._verify is not None else 0

    def _complete(self, out: ForwardOutput) -> StepOutput:
        if self._state is None and self._cache.length + self._chunk < len(self._prompt):
            self._cache.commit()  # a prefill chunk: no token yet
            self._prefilled.append(out.hidden[0])
            return StepOutput([], "", False, None, None, None)
        new_tokens, rows = self._first_token(out) if self._state is None else self._accept(out)
        return self._commit(new_tokens, rows)

    def _first_token(self, out: ForwardOutput) -> tuple[list[int], torch.Tensor]:
        self._cache.commit()
        last = out.logits[0, -1]  # (V,)
        if self._processor is not None:
            last = self._processor.apply(last)
        first = (
            int(last.argmax())
            if self._sampler.greedy
            else self._sampler.sample(self._sampler.probs(last))
        )
        if self._processor is not None:
            self._processor.advance(first)
        self._state = DecodeState(
            tokens=[*self._prompt, first],
            prompt_len=len(self._prompt),
            k=self._k,
            sampler=self._sampler,
            hidden=torch.cat([*self._prefilled, out.hidden[0]]),  # (prompt, C)
            hidden_start=0,
            constraint=self._grammar,
            max_new_tokens=self._max_new_tokens,
        )
        self._prefilled = []
        self.stats.verify_steps += 1
        self.stats.first_token_at = time.perf_counter()
        return [first], last.unsqueeze(0)

    def _accept(self, out: ForwardOutput) -> tuple[list[int], torch.Tensor]:
        state, step = self._state, self._verify
        assert state is not None and step is not None, "prepared before completed"
        result = step.finish(out, self._sampler, self._processor)
        self._verify = None
        state.tokens.extend(result.tokens)
        state.hidden, state.hidden_start, state.last = result.hidden, step.start, result
        self.stats.verify_steps += 1
        self.stats.num_proposed_drafts += result.num_proposed
        self.stats.num_correct_drafts += len(result.accepted)
        self.stats.add_accepted(len(result.accepted), result.num_proposed)
        if step.draft.source is not None:
            self.stats.by_source.setdefault(step.draft.source, SourceTally()).add(
                max(step.draft.depths, default=0), len(result.accepted))
        return result.tokens, result.logits

    def _fit(self, draft: Draft, state: DecodeState) -> Draft:
        """Trim a draft to k nodes, to the tokens still allowed, and to the cache's room."""
        left_tokens = state.tokens_left or 0  # the state carries the budget (set above)
        left_context = self._engine.max_context - len(state.tokens)
        room = self._cache.max_length - self._cache.length - 1  # slots after the root
        if draft.aux is not None and len(draft.aux.tokens) + len(draft) > room:
            draft.aux = None
        max_depth = min(left_tokens, left_context) - 1
        return draft.prune(min(self._k, room), max_depth)

    def _commit(self, new_tokens: list[int], rows: torch.Tensor) -> StepOutput:
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
        logprobs = None if self._top_logprobs is None else token_logprobs(
            new_tokens, rows, self._sampler, self._top_logprobs)
        return StepOutput(new_tokens, text, self.finished, reason, matched, logprobs)

    def _prompt_len_plus_output(self) -> int:
        return len(self._prompt) + len(self.output_ids)
