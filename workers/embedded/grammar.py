"""Constrained decoding: a request's grammar as a token processor, with llguidance.

llguidance (github.com/guidance-ai/llguidance) compiles a JSON schema, a regular
expression or a Lark/GBNF grammar against the model's tokenizer and keeps an incremental
matcher per request: `fill_next_token_bitmask` gives the tokens allowed next,
`consume_token` advances, `rollback` undoes. Chosen over xgrammar (SGLang's default) on
install weight at an equal per-token cost on this CPU; docs/WORKER.md has the figures.

Speculation stays on under a grammar. Verification masks the target's logits at every
row it visits with the matcher's state after the tokens accepted before it (see
`speculative.processors`), so greedy output is constrained plain decoding's token for
token and sampled output follows the constrained distribution. Before the forward,
`GrammarProcessor.prune` walks the draft tree with the matcher (consume, then roll back)
and drops what the grammar forbids, so no forward row is spent on a token that cannot
be accepted.

Legend: V vocabulary, W = ceil(V / 32) mask words.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

import llguidance
import torch

from workers.embedded.api import Constraint, EngineInputError
from workers.embedded.speculative.draft import Draft

# OpenAI response_format json_object: any JSON object (SGLang's own route sends the same).
JSON_OBJECT_SCHEMA = '{"type": "object"}'
# Fixed separators, no free whitespace between tokens: a small model left free to emit
# whitespace inside JSON may pad until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarCompiler:
    """The model's tokenizer as llguidance sees it (built on first use: about a second for
    a 49k vocabulary) and a cache of compiled grammars."""

    def __init__(self, tokenizer_json: Path, stop_ids: tuple[int, ...], vocab_size: int) -> None:
        self._path, self._stop_ids, self.vocab_size = tokenizer_json, stop_ids, vocab_size

    @functools.cached_property
    def tokenizer(self) -> llguidance.LLTokenizer:
        return llguidance.LLTokenizer(str(self._path), eos_token=list(self._stop_ids))

    @functools.lru_cache(maxsize=256)  # noqa: B019 (one compiler per engine, engines live long)
    def compile(self, constraint: Constraint) -> str:
        """The llguidance grammar of a constraint; EngineInputError names what is wrong."""
        try:
            if constraint.kind == "json_schema":
                schema = json.loads(constraint.text)
                if not isinstance(schema, dict):
                    raise EngineInputError("json_schema must be a JSON object")
                grammar = llguidance.LLMatcher.grammar_from_json_schema(
                    schema, defaults=JSON_OPTIONS)  # type: ignore[arg-type]
            else:
                grammar = llguidance.grammar_from(
                    "grammar" if constraint.kind == "ebnf" else constraint.kind, constraint.text)
        except (ValueError, TypeError) as exc:
            raise EngineInputError(f"invalid {constraint.kind}: {exc}") from exc
        is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(
            grammar, self.tokenizer)
        if is_error:
            raise EngineInputError(f"invalid {constraint.kind}: {messages[0]}")
        return grammar

    def processor(self, constraint: Constraint, device: torch.device) -> GrammarProcessor:
        matcher = llguidance.LLMatcher(self.tokenizer, self.compile(constraint), log_level=0)
        return GrammarProcessor(matcher, self.vocab_size, device)


class GrammarProcessor:
    """One request's matcher as a `TokenProcessor`: forbidden tokens get -inf."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab_size: int,
                 device: torch.device) -> None:
        self.matcher = matcher
        self.vocab_size = vocab_size
        # (W,) int32, one bit per token; not llguidance.torch's helpers: that module
        # wraps a kernel in torch.compile at import, which costs seconds per process
        self._bitmask = torch.full(((vocab_size + 31) // 32,), -1, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32)  # (32,)
        self._device = device
        self._pushed = 0  # draft tokens consumed while a drafter drafts

    def allowed(self) -> torch.Tensor:
        """(V,) bool: the tokens the grammar allows next."""
        self.matcher.unsafe_compute_mask_ptr(self._bitmask.data_ptr(),
                                             self._bitmask.numel() * 4)
        bits = (self._bitmask.unsqueeze(-1) >> self._bits) & 1  # (W, 32)
        return bits.view(-1)[: self.vocab_size].bool().to(self._device)

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        allowed = self.allowed()
        if not bool(allowed.any()):
            raise RuntimeError(f"grammar allows no token: {self.matcher.get_error()}")
        out = torch.full_like(logits, float("-inf"))
        width = min(logits.shape[-1], allowed.shape[0])
        out[:width] = logits[:width].masked_fill(~allowed[:width], float("-inf"))
        return out

    def advance(self, token: int) -> None:
        if not self.matcher.consume_token(token):
            raise RuntimeError(f"grammar rejected committed token {token}: "
                               f"{self.matcher.get_error()}")

    # DraftConstraint: a chain drafter drafts under the grammar, then everything is undone.
    def restrict(self, logits: torch.Tensor) -> torch.Tensor:
        return self.apply(logits)

    def push(self, token: int) -> bool:
        if self.matcher.validate_tokens([token]) != 1:
            return False
        self.matcher.consume_token(token)
        self._pushed += 1
        return not self.matcher.is_stopped()

    def undo(self) -> None:
        if self._pushed:
            self.matcher.rollback(self._pushed)
            self._pushed = 0

    def prune(self, draft: Draft) -> Draft:
        """The draft without nodes the grammar forbids after their path. A node drawn from
        a distribution q stays (rejecting it draws from the residual, which keeps sampling
        exact) but loses its subtree; a point-mass node goes with its subtree."""
        children = draft.children()
        keep: list[int] = []

        def visit(row: int) -> None:
            for node in children[row]:
                token = draft.tokens[node]
                if self.matcher.validate_tokens([token]) == 1:
                    keep.append(node)
                    self.matcher.consume_token(token)
                    visit(1 + node)
                    self.matcher.rollback(1)
                elif draft.q is not None:
                    keep.append(node)

        visit(0)
        return draft.subset(sorted(keep))
