"""The HTTP protocol's own transport stand-in (doors/http.py OneWritePerTurn), on a real
event loop: a response's head and body leave in one write, and the body does not wait for
the end of the loop's turn (the middleware's unwinding, the turn's trace lines)."""

from __future__ import annotations

import asyncio
from typing import Any

from taogpud.doors.http import OneWritePerTurn


class RecordingTransport:
    """What the loop's transport was asked to write, and whether the turn had ended."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"extra:{name}"


def test_head_and_body_leave_in_one_write_before_the_turn_ends() -> None:
    async def answer() -> list[bytes]:
        inner = RecordingTransport()
        joined = OneWritePerTurn(inner)
        joined.write(b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n")
        assert inner.writes == []  # the head waits for its body
        joined.write(b"{}")
        return list(inner.writes)  # still inside the same turn

    assert asyncio.run(answer()) == [b"HTTP/1.1 201 Created\r\ncontent-length: 2\r\n\r\n{}"]


def test_a_write_with_nothing_after_it_leaves_at_the_end_of_the_turn() -> None:
    async def stream() -> tuple[list[bytes], list[bytes]]:
        inner = RecordingTransport()
        joined = OneWritePerTurn(inner)
        joined.write(b"head")
        during = list(inner.writes)
        await asyncio.sleep(0)  # the turn ends
        return during, list(inner.writes)

    during, after = asyncio.run(stream())
    assert during == []
    assert after == [b"head"]


def test_pieces_pair_up_and_close_sends_what_is_held() -> None:
    async def pieces() -> tuple[list[bytes], bool]:
        inner = RecordingTransport()
        joined = OneWritePerTurn(inner)
        joined.writelines([b"a", b"b", b"c"])
        joined.close()
        await asyncio.sleep(0)  # the turn's own flush finds nothing left
        return list(inner.writes), inner.closed

    writes, closed = asyncio.run(pieces())
    assert writes == [b"ab", b"c"]
    assert closed


def test_abort_drops_what_is_held_and_the_rest_is_the_transports() -> None:
    async def aborted() -> list[bytes]:
        inner = RecordingTransport()
        joined = OneWritePerTurn(inner)
        assert joined.get_extra_info("socket") == "extra:socket"
        joined.write(b"head")
        joined.abort()
        await asyncio.sleep(0)
        return list(inner.writes)

    assert asyncio.run(aborted()) == []
