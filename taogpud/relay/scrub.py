"""The key, kept out of everything the provider sends back: header names and values, and
bodies of every status, streamed or not.

    KeyBytes(forms)          the key's forms as bytes (Scrubber.forms: raw, escaped, base64)
    KeyBytes.whole(data)     each form in `data` replaced (a header, a name)
    KeyBytes.stream()        a StreamScrub for one body, fed piece by piece

A form becomes as many bytes as it had (`<redacted>` padded with `*`, or only `*`), so a body
keeps its Content-Length and is never read whole to scrub it. In a stream a form may arrive
split across pieces: a piece's last bytes are held back while they could be the start of a
form (at most the longest form less one byte, usually none: an event ends in a newline), and
go out in front of the next piece. A stream that ends on eight or more bytes of the key's
start does not send them.
"""

from __future__ import annotations

from collections.abc import Iterable

MARK = b"<redacted>"
HELD_SHOWN_MAX = 7  # a held tail this long or shorter goes out at the end as it is


def _blank(length: int) -> bytes:
    return MARK.ljust(length, b"*") if length >= len(MARK) else b"*" * length


class KeyBytes:
    def __init__(self, forms: Iterable[str]) -> None:
        encoded = sorted({form.encode("utf-8", "replace") for form in forms}, key=len)
        self._forms = tuple(reversed(encoded))  # longest first, as Scrubber replaces them
        self._blanks = tuple(_blank(len(form)) for form in self._forms)
        self._firsts = frozenset(form[0] for form in self._forms)
        self.longest = len(self._forms[0]) if self._forms else 0

    def whole(self, data: bytes) -> bytes:
        for form, blank in zip(self._forms, self._blanks, strict=True):
            data = data.replace(form, blank)
        return data

    def stream(self) -> StreamScrub:
        return StreamScrub(self)

    def held_from(self, data: bytes) -> int:
        """Where the longest tail of `data` that is the start of a form begins; len(data)
        when no tail is (the common case: the loop looks at no more than longest-1 bytes)."""
        for start in range(max(0, len(data) - self.longest + 1), len(data)):
            if data[start] in self._firsts and self._starts_a_form(data[start:]):
                return start
        return len(data)

    def _starts_a_form(self, tail: bytes) -> bool:
        return any(form.startswith(tail) for form in self._forms)


class StreamScrub:
    """One body's scrub: `feed` gives what may go out now, `end` what was held back."""

    def __init__(self, key: KeyBytes) -> None:
        self._key = key
        self._held = b""

    def feed(self, piece: bytes) -> bytes:
        data = self._key.whole(self._held + piece if self._held else piece)
        cut = self._key.held_from(data)
        self._held = data[cut:]
        return data[:cut] if cut < len(data) else data

    def end(self) -> bytes:
        held, self._held = self._held, b""
        return held if len(held) <= HELD_SHOWN_MAX else _blank(len(held))
