"""What a worker reports about one request: its token usage and speculation counters.

The adapters parse a worker's reply into these (defensively: a field that is not a
non-negative number reads as not reported); the request record and the responses read
them.
"""

from __future__ import annotations

from dataclasses import dataclass

from policies.fleet import WORKER_BATCH_KEY

# A hybrid worker's per-branch counts in meta_info / sglext (workers/embedded/responses.py
# DRAFTS_KEY): {branch: {"steps": n, "accepted": n}}, branches `ngram`, `eagle`, `none`.
DRAFTS_KEY = "specroute_drafts"
Drafts = dict[str, tuple[int, int]]  # branch -> (decode steps drafted, accepted draft tokens)


@dataclass(slots=True)
class SpecStats:
    """Per-request speculation outcome as the worker reported it.

    accept_length: tokens emitted per verify step, bonus token included (SGLang
    `spec_accept_length`, vLLM `mean_acceptance_length`); 0.0 = not reported.
    batch, batch_draft_tokens: the embedded worker's `specroute_batch` (plain requests
    too): mean requests in the worker's batch over this request's decode steps, and mean
    draft tokens verified per step across that batch; None = not reported.
    decode_s: its seconds from the first token to the end, in the worker (`specroute_batch`
    too); None = not reported.
    drafts: a hybrid worker's `specroute_drafts`, per branch (steps, accepted draft tokens);
    None = not reported.
    """

    verify_steps: int = 0
    accept_length: float = 0.0
    accept_rate: float | None = None
    correct_drafts: int = 0
    proposed_drafts: int = 0
    batch: float | None = None
    batch_draft_tokens: float | None = None
    decode_s: float | None = None
    drafts: Drafts | None = None
    # decode verify steps by draft tokens accepted (SGLang's spec_correct_drafts_histogram)
    accept_histogram: tuple[int, ...] | None = None

    @property
    def has_counters(self) -> bool:
        """Whether any speculation counter was reported (the batch fields aside)."""
        return bool(self.verify_steps or self.accept_length or self.accept_rate is not None
                    or self.correct_drafts or self.proposed_drafts)




def non_negative(value: object) -> float | None:
    """A non-negative finite number as float; anything else (a worker's odd body) None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if 0.0 <= number < float("inf") else None


def read_batch(spec: SpecStats, holder: object) -> SpecStats:
    """`spec` with the batch fields of `holder[WORKER_BATCH_KEY]` (meta_info or sglext) when it
    has them; values that are not non-negative numbers are ignored (None)."""
    batch = holder.get(WORKER_BATCH_KEY) if isinstance(holder, dict) else None
    if isinstance(batch, dict):
        spec.batch = non_negative(batch.get("requests"))
        spec.batch_draft_tokens = non_negative(batch.get("draft_tokens"))
        spec.decode_s = non_negative(batch.get("decode_s"))
    if isinstance(holder, dict) and (drafts := read_drafts(holder.get(DRAFTS_KEY))):
        spec.drafts = drafts
    return spec


def read_drafts(value: object) -> Drafts | None:
    """`specroute_drafts` as {branch: (steps, accepted)}; a branch whose counts are not
    non-negative integers is left out, None when none is left."""
    if not isinstance(value, dict):
        return None
    out: Drafts = {}
    for branch, counts in list(value.items())[:8]:  # a worker names three; bound the rest
        if not isinstance(branch, str) or not isinstance(counts, dict):
            continue
        steps, accepted = counts.get("steps"), counts.get("accepted")
        if all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
               for n in (steps, accepted)):
            out[branch[:32]] = (int(steps), int(accepted))  # type: ignore[arg-type]
    return out or None


def merge_spec(new: SpecStats | None, old: SpecStats) -> SpecStats:
    """A stream's stats after a chunk that said `new`: counters from the chunk that has
    them, batch fields from the chunk that has them, so that a chunk carrying only one
    kind does not wipe the other."""
    if new is None:
        return old
    merged = new if new.has_counters else SpecStats(
        old.verify_steps, old.accept_length, old.accept_rate, old.correct_drafts,
        old.proposed_drafts, accept_histogram=old.accept_histogram)
    merged.batch = new.batch if new.batch is not None else old.batch
    merged.batch_draft_tokens = new.batch_draft_tokens \
        if new.batch_draft_tokens is not None else old.batch_draft_tokens
    merged.decode_s = new.decode_s if new.decode_s is not None else old.decode_s
    merged.drafts = new.drafts if new.drafts is not None else old.drafts
    return merged


@dataclass(slots=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
