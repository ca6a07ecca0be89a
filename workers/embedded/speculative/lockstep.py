"""Drafting every sequence of an engine step in lock-step.

A drafter that can draft beside others offers `propose_steps(state)`: a generator that
yields each network call it needs (a `Call`) and is sent the call's answer, returning its
`Draft`. `draft_together` drives all of a step's generators at once: each round, the
calls waiting on the same network (`Call.group`) are answered by ONE batched call
(`Call.answer_all`), so N sequences cost one forward of that network per round, not N.
The EAGLE head (`speculative.eagle.HeadCall`: one head forward per draft depth) and the
Medusa heads (`speculative.medusa.MedusaCall`: one forward of every head) draft so.
Alone, a drafter is the same generator answered one call at a time.
"""

from __future__ import annotations

from collections.abc import Generator, Sequence
from typing import Any, Protocol

from workers.embedded.speculative.draft import Draft


class Call(Protocol):
    """A network call a drafter waits for."""

    @property
    def group(self) -> int:
        """Calls with equal groups run on the same network, so are answered together."""
        ...

    @staticmethod
    def answer_all(calls: Sequence[Any]) -> list[Any]:
        """Each call's answer, from one batched call (all `calls` share a group)."""
        ...


DraftSteps = Generator[Call, Any, Draft]


def draft_alone(steps: DraftSteps) -> Draft:
    """One drafter's generator answered one call at a time."""
    draft = draft_together({0: steps})[0]
    if isinstance(draft, Exception):
        raise draft
    return draft


def draft_together(drafters: dict[int, DraftSteps]) -> dict[int, Draft | Exception]:
    """Drive several drafters in lock-step: each round answers every waiting call of a
    group with one `answer_all`. A drafter that raises gets its exception; if a batched
    round fails, its calls are answered one by one, so one bad sequence fails alone (a
    failed forward leaves only pending cache entries, which the next forward overwrites)."""
    results: dict[int, Draft | Exception] = {}
    waiting: dict[int, Call] = {}

    def resume(i: int, reply: object | None) -> None:
        try:
            waiting[i] = next(drafters[i]) if reply is None else drafters[i].send(reply)
        except StopIteration as done:
            results[i] = done.value
        except Exception as exc:  # this sequence's drafting failed
            results[i] = exc

    for i in drafters:
        resume(i, None)
    while waiting:
        rounds: dict[tuple[type[Call], int], list[tuple[int, Call]]] = {}
        for i, call in waiting.items():
            rounds.setdefault((type(call), call.group), []).append((i, call))
        waiting = {}
        for (kind, _), group in rounds.items():
            try:
                replies: list = kind.answer_all([call for _, call in group])
            except Exception:
                replies = []
                for _, call in group:
                    try:
                        replies.append(kind.answer_all([call])[0])
                    except Exception as exc:
                        replies.append(exc)
            for (i, _), reply in zip(group, replies, strict=True):
                if isinstance(reply, Exception):
                    drafters[i].close()
                    results[i] = reply
                else:
                    resume(i, reply)
    return results
