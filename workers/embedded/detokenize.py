"""Incremental detokenisation: the text delta of each step's new tokens, stop strings cut."""

from __future__ import annotations

from workers.embedded.tokenizer import TextTokenizer


class TextStream:
    """Incremental detokenisation with text-level stop strings.

    Each push decodes only the ids not yet read, with the previously read chunk as context:
    text(ids[prefix:]) minus text(ids[prefix:read]) (vLLM's `detokenize_incrementally`,
    after Hugging Face TGI), so a step costs its new tokens, not the whole output. A chunk
    whose text ends in U+FFFD, an incomplete UTF-8 sequence (byte-level BPE splits a
    character's bytes across tokens), stays unread until the bytes completing it arrive;
    the whole characters before it are shown meanwhile. Also holds back any tail that could
    still grow into a stop string, so emitted text never has to be taken back.
    """

    def __init__(self, tokenizer: TextTokenizer, stops: list[str]) -> None:
        self._tokenizer = tokenizer
        self._stops = stops
        self._ids: list[int] = []
        self._prefix = 0  # ids[prefix:read]: decoding context for the unread ids
        self._read = 0  # ids[:read] are in _text
        self._text = ""  # text of ids[:read]; always ends on a whole character
        self._emitted = 0  # characters returned so far

    def push(self, ids: list[int], final: bool) -> tuple[str, tuple[str, int] | None]:
        """Add ids; return (text delta, (matched stop, ids of this push to keep) or None)."""
        mark = (len(self._ids), self._prefix, self._read, len(self._text))
        self._ids.extend(ids)
        full = self._decode()
        hit = self._find_stop(full)
        if hit is not None:
            index, stop = hit
            keep = self._ids_through(mark, stop)
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
        return self._emit(self._decode())

    def _decode(self) -> str:
        """The text of all ids so far (an incomplete last character as U+FFFD)."""
        unread = self._unread_text(self._prefix, self._read, len(self._ids))
        if unread and not unread.endswith("\ufffd"):
            self._text += unread
            self._prefix, self._read = self._read, len(self._ids)
            return self._text
        return self._text + unread

    def _unread_text(self, prefix: int, read: int, end: int) -> str:
        """Text of ids[read:end], decoded after ids[prefix:read] as context."""
        context = self._tokenizer.decode(self._ids[prefix:read]) if read > prefix else ""
        return self._tokenizer.decode(self._ids[prefix:end])[len(context) :]

    def _find_stop(self, full: str) -> tuple[int, str] | None:
        best: tuple[int, str] | None = None
        for stop in self._stops:
            index = full.find(stop, max(0, self._emitted - len(stop) + 1))
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _ids_through(self, mark: tuple[int, int, int, int], stop: str) -> int:
        """How many of the pushed ids it takes for the stop string to appear."""
        before, prefix, read, text_length = mark
        head = self._text[:text_length]  # text of ids[:read] at the push
        window = max(0, self._emitted - len(stop) + 1)
        for n in range(1, len(self._ids) - before + 1):
            text = head + self._unread_text(prefix, read, before + n)
            if stop in text[window:]:
                return n
        return len(self._ids) - before

    def _emit(self, text: str) -> str:
        delta = text[self._emitted :]
        self._emitted = max(self._emitted, len(text))
        return delta
