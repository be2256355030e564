"""The one serve helper (taogpud/doors/serve.py) every HTTP listener of the daemon starts
through: the control socket and the relay's TCP port. It serves through the listener's door
until stopped, and a server that could not start raises what stopped it.

Real parts: uvicorn on a Unix socket in the test's folder and on 127.0.0.1, asked over HTTP.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Any

import httpx
import pytest

from taogpud.config import ServerSection
from taogpud.doors import Doors, serve_http
from taogpud.host.unix_socket import bind_unix_socket


async def hello(scope: dict[str, Any], receive: Any, send: Any) -> None:
    assert scope["type"] == "http"
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"hello"})


def _doors() -> Doors:
    return Doors(ServerSection, 1024)


async def _serve_ask_stop(sock: socket.socket, client: httpx.AsyncClient) -> list[object]:
    doors = _doors()
    listener = await serve_http(hello, doors, "test", sock, lambda: 1 << 20)
    seen: list[object] = [[door.name for door in doors.listed]]
    seen.append((await client.get("/")).text)
    await listener.stop()
    seen.append(listener.serving.done())
    with pytest.raises(httpx.ConnectError):
        await client.get("/")
    return seen


def test_a_unix_listener_serves_through_its_door_until_stopped(tmp_path: Path) -> None:
    path = tmp_path / "test.sock"
    transport = httpx.AsyncHTTPTransport(uds=str(path))

    async def run() -> list[object]:
        async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
            return await _serve_ask_stop(bind_unix_socket(path), client)

    assert asyncio.run(run()) == [["test"], "hello", True]


def test_a_tcp_listener_serves_through_its_door_until_stopped() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen()
    sock.setblocking(False)
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"

    async def run() -> list[object]:
        async with httpx.AsyncClient(base_url=base) as client:
            return await _serve_ask_stop(sock, client)

    assert asyncio.run(run()) == [["test"], "hello", True]


def test_a_listener_that_cannot_start_raises_what_stopped_it() -> None:
    """A datagram socket, which uvicorn cannot serve: its start fails in the server's task,
    and the helper raises that, rather than wait for a `started` that never comes."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.bind(("127.0.0.1", 0))

    async def run() -> None:
        await serve_http(hello, _doors(), "test", sock, lambda: 1 << 20)

    with pytest.raises(ValueError, match="Stream Socket"):
        asyncio.run(run())
    sock.close()
