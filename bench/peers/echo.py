"""The floor: a bare asyncio server echoing the bytes of a taogpud submit over a Unix socket."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from typing import Any

from bench.load import Call, Plan, in_processes, sequential, socket_server
from bench.peers.tiny import SUBMIT_REQUEST
from bench.stats import DispatchRow

NAME = "bare asyncio Unix-socket echo (floor)"


def measure(plan: Plan, clients: int, concurrent: Plan) -> list[DispatchRow]:
    with serving() as path:
        with open_caller(path) as call:
            one = sequential(call, plan)
        many = in_processes(open_caller, [(path,)] * clients, concurrent)
    note = "the same request bytes, echoed; default asyncio loop"
    return [DispatchRow.from_runs(NAME, 1, one, note), DispatchRow.from_runs(NAME, clients, many)]


def serving() -> contextlib.AbstractContextManager[str]:
    return socket_server(_serve, "echo")


@contextlib.contextmanager
def open_caller(path: str) -> Iterator[Call]:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)

        def call() -> None:
            sock.sendall(SUBMIT_REQUEST)
            received = 0
            while received < len(SUBMIT_REQUEST):
                received += len(sock.recv(65536))

        yield call


def _serve(path: str, ready: Any) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())
