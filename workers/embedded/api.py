"""The engine's interface to the server: what goes in, what comes out. Imports no torch.

The server parses a request, has the engine validate it once (`validate` -> a
`DecodeRequest` with method and k resolved), and the scheduler's thread starts it
(`generate`) and steps the returned `RunningGeneration`; each step yields a
`StepOutput`, and the generation's `GenerationStats` are read after every step.
`EngineInputError` is the one error for a request that cannot be served as given.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol


class EngineInputError(ValueError):
    """The request cannot be served as given (the server answers HTTP 400)."""


ConstraintKind = Literal["json_schema", "regex", "ebnf", "lark"]


@dataclass(frozen=True)
class Constraint:
    """A grammar the output must follow (SGLang's `json_schema` / `regex` / `ebnf` sampling
    params): `text` is the schema as JSON text, the regular expression, or the grammar
    (GBNF or Lark; `lark`: llguidance's Lark, which the worker's tool calls use). OpenAI's
    `json_object` is the schema `{"type": "object"}`."""

    kind: ConstraintKind
    text: str


@dataclass
class SamplingParams:
    max_new_tokens: int | None = 128  # None: the rest of the context
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    stop: list[str] = field(default_factory=list)
    stop_token_ids: list[int] = field(default_factory=list)
    ignore_eos: bool = False
    seed: int | None = None
    constraint: Constraint | None = None
    presence_penalty: float = 0.0  # OpenAI's: subtracted once a token has been generated
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per time it has been generated
    logit_bias: dict[int, float] = field(default_factory=dict)  # token id -> added logit
    top_logprobs: int | None = None  # None: no logprobs; 0: the chosen token's only

    @property
    def shapes_logits(self) -> bool:
        """Whether the target's logits are changed per position along a draft path."""
        return (self.constraint is not None or bool(self.logit_bias)
                or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0)


@dataclass(frozen=True)
class DecodeRequest:
    """A request the engine has validated: method and k are final (k = 0: plain decoding),
    `params.max_new_tokens` is set."""

    input_ids: list[int]
    params: SamplingParams
    method: str
    k: int

    @property
    def max_new_tokens(self) -> int:
        assert self.params.max_new_tokens is not None, "validate() sets it"
        return self.params.max_new_tokens

    @property
    def speculative(self) -> bool:
        return self.k > 0


@dataclass
class SourceTally:
    """The verify steps one drafter of a request drafted (`Draft.source`: a hybrid's n-gram
    or EAGLE branch). Per draft depth d (index d - 1): `proposed_at` counts the steps whose
    draft reached depth d, `accepted_at` those whose accepted path did; so the acceptance
    at depth d given depth d - 1 is accepted_at[d - 1] / accepted_at[d - 2]."""

    steps: int = 0
    proposed_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def add(self, depth: int, accepted: int) -> None:
        """One step whose draft was `depth` deep and whose accepted path was `accepted` long."""
        self.steps += 1
        for counts, reach in ((self.proposed_at, depth), (self.accepted_at, accepted)):
            counts.extend([0] * (reach - len(counts)))
            for d in range(reach):
                counts[d] += 1

    @property
    def accepted(self) -> int:
        """Draft tokens accepted over these steps."""
        return sum(self.accepted_at)

    @property
    def drafted(self) -> int:
        """Steps whose draft held at least one token."""
        return self.proposed_at[0] if self.proposed_at else 0


NO_DRAFT = "none"  # the branch of steps whose draft came out empty
PLAIN_BRANCH = "plain"  # steps a drafter chose to take without a draft (hybrid)


@dataclass
class GenerationStats:
    """Counters in SGLang's meta_info terms. verify_steps counts every target forward that
    committed tokens, the prefill included, so plain decoding has accept_length 1.0.

    The batch_* sums describe the batched forwards this request's decode steps rode in
    (`GenerationEngine.step`): one `batch_steps` per decode/verify step of this request,
    i.e. every verify step but the prefill step that gave the first token (verify_steps - 1
    once a request has its first token; prefill-only chunks are no steps either). Per
    counted step, `batch_requests` adds the sequences in that forward (this one, the other
    requests' decode steps and any prefill chunks riding along) and `batch_draft_tokens`
    adds the draft tokens the forward verified, summed over its sequences: the tree nodes
    each drafter proposed after pruning to k and to the room left (what the target scored;
    n-gram may propose fewer than k), 0 for plain decoding and prefill chunks, lookahead's
    auxiliary branch not counted. `first_token_at` dates the end of prefill, so the answer
    can say how long the decode steps took (`decode_s` in `specroute_batch`).
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0
    verify_steps: int = 0
    num_proposed_drafts: int = 0
    num_correct_drafts: int = 0
    batch_steps: int = 0
    batch_requests: int = 0
    batch_draft_tokens: int = 0
    first_token_at: float | None = None  # time.perf_counter() when the first token came
    # per drafter, where a method has several (hybrid); on the wire as `branches()`
    by_source: dict[str, SourceTally] = field(default_factory=dict)
    # decode verify steps by the draft tokens they accepted (index: accepted, 0..k), the
    # prefill step not counted: SGLang's per-request `spec_correct_drafts_histogram`
    accept_histogram: list[int] = field(default_factory=list)
    # decode verify steps by the draft tokens they verified (index: 0..k): a step's cost
    # is not linear in its draft on every device (`bench.engine.verify_cost`)
    draft_histogram: list[int] = field(default_factory=list)

    def add_accepted(self, accepted: int, drafted: int | None = None) -> None:
        """Count one decode verify step that accepted `accepted` of `drafted` draft tokens."""
        _bump(self.accept_histogram, accepted)
        if drafted is not None:
            _bump(self.draft_histogram, drafted)

    def add_batch_step(self, requests: int, draft_tokens: int) -> None:
        """Count one decode step that shared a forward with `requests` sequences (this one
        included) verifying `draft_tokens` draft tokens in all."""
        self.batch_steps += 1
        self.batch_requests += requests
        self.batch_draft_tokens += draft_tokens

    @property
    def mean_batch(self) -> float | None:
        """Mean sequences per forward over the counted steps; None before the first."""
        return self.batch_requests / self.batch_steps if self.batch_steps else None

    @property
    def mean_batch_draft_tokens(self) -> float | None:
        """Mean draft tokens per forward over the counted steps; None before the first."""
        return self.batch_draft_tokens / self.batch_steps if self.batch_steps else None

    def branches(self) -> dict[str, dict[str, int]]:
        """Per branch of a method with several drafters (hybrid: `ngram`, `eagle`), the
        decode steps it drafted and the draft tokens accepted from it; `PLAIN_BRANCH`: the
        steps the drafter chose to take plain (no draft paid for); `NO_DRAFT`: the other
        steps whose draft was empty (an EAGLE chain cut at its first token's confidence,
        a draft pruned to the token budget). Empty for a single-drafter method."""
        if not self.by_source:
            return {}
        out = {NO_DRAFT: {"steps": 0, "accepted": 0}, PLAIN_BRANCH: {"steps": 0, "accepted": 0}}
        for source, tally in sorted(self.by_source.items()):
            if source == PLAIN_BRANCH:
                out[source]["steps"] = tally.steps
                continue
            out[source] = {"steps": tally.drafted, "accepted": tally.accepted}
            out[NO_DRAFT]["steps"] += tally.steps - tally.drafted
        return out

    @property
    def accept_length(self) -> float:
        return self.completion_tokens / self.verify_steps if self.verify_steps else 0.0

    @property
    def accept_rate(self) -> float:
        return (
            self.num_correct_drafts / self.num_proposed_drafts if self.num_proposed_drafts else 0.0
        )


@dataclass(frozen=True)
class TokenLogprob:
    """A committed token's log-probability under the target model (raw logits, before
    temperature and constraints: what OpenAI and SGLang report), with the most likely
    alternatives at that position, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass
class StepOutput:
    token_ids: list[int]  # tokens committed this step
    text: str  # text delta (stop string removed; incomplete UTF-8 held back)
    finished: bool
    finish_reason: str | None  # "stop" | "length" | None
    matched_stop: str | int | None
    logprobs: list[TokenLogprob] | None = None  # one per token_ids entry, when asked for


class RunningGeneration(Protocol):
    """One started request; stepped from one thread."""

    @property
    def stats(self) -> GenerationStats: ...

    def step(self) -> StepOutput: ...

    def cancel(self) -> None: ...


class ChatTokenizer(Protocol):
    """What the server needs of the model's tokenizer: chat prompts as ids (message text
    never becomes control tokens) and the ids that end a generation."""

    stop_ids: tuple[int, ...]

    def encode_chat(self, messages: Sequence[dict[str, str]],
                    add_generation_prompt: bool = True) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


class GenerationEngine(Protocol):
    """What the server and the scheduler need of an engine."""

    @property
    def tokenizer(self) -> ChatTokenizer: ...

    @property
    def methods(self) -> tuple[str, ...]: ...

    @property
    def default_k(self) -> dict[str, int]: ...

    @property
    def max_context(self) -> int: ...

    def validate(self, prompt: str | list[int], params: SamplingParams, method: str,
                 k: int | None) -> DecodeRequest: ...

    def generate(self, request: DecodeRequest) -> RunningGeneration: ...

    def step(self, generations: Sequence[RunningGeneration]) -> list[StepOutput | Exception]:
        """Advance several generations in one batched target forward: per generation, in
        order, its output or the exception that ended it."""
        ...


def _bump(histogram: list[int], index: int) -> None:
    if index >= len(histogram):
        histogram.extend([0] * (index + 1 - len(histogram)))
    histogram[index] += 1
