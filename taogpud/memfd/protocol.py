"""What a local client and the daemon speak on the shared-memory socket (docs/shared-memory.md).

Beside the HTTP socket, `<socket>.shm`: the same 0660 mode and group, SO_PEERCRED for the
uid. Each message is a 4-byte big-endian length and that many bytes of JSON. Descriptors
(SCM_RIGHTS) ride on a message's bytes, sent with it in one sendmsg; the daemon gives them
to the message whose bytes they came with (the kernel ends a read after such a message).

    client → daemon                                             daemon → client
    {"op": "attach"}  + the connection's memfd                  {"memory": {"size", "writable"},
                                                                  "max_in_flight": n}
    {"op": "submit", "task", "params", "inputs", "output",     {"job": JobRecord} when it ended
     "sealed", "device", "priority", "timeout_s"}  (+ a sealed memfd when "sealed")
    any                                                         {"error": {code, message, hint}}

A request may carry an "id" (a number or a string): its answer carries the same id. Up to
MAX_IN_FLIGHT submits may wait for their jobs on one connection; each is answered when its
job ends, in whatever order they end, and one more is refused (`too_many_in_flight`).

inputs: name → {"offset", "shape", "dtype"[, "nbytes"]}; output: {"offset", "nbytes"} in the
attached memory; with "sealed" the inputs lie in the sealed memfd sent with the submit.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

SUFFIX = ".shm"
MAX_MESSAGE_BYTES = 1 << 20
MAX_FDS = 2  # the most descriptors one message may carry
MAX_IN_FLIGHT = 16  # submits one connection may have waiting for their jobs
HEADER_BYTES = 4


def socket_path_for(http_socket: Path | str) -> Path:
    """The shared-memory socket beside the daemon's HTTP socket."""
    path = Path(http_socket)
    return path.with_name(path.name + SUFFIX)


def encode(message: dict[str, Any]) -> bytes:
    body = json.dumps(message, separators=(",", ":")).encode()
    return len(body).to_bytes(HEADER_BYTES, "big") + body


def take_message(buffer: bytearray) -> dict[str, Any] | None:
    """The first whole message in `buffer` (removed from it), or None until one is whole.
    ValueError for a length over the limit or a body that is not a JSON object."""
    if len(buffer) < HEADER_BYTES:
        return None
    length = int.from_bytes(buffer[:HEADER_BYTES], "big")
    if length > MAX_MESSAGE_BYTES:
        raise ValueError(f"a message of {length} bytes is over the limit of {MAX_MESSAGE_BYTES}")
    if len(buffer) < HEADER_BYTES + length:
        return None
    body = bytes(buffer[HEADER_BYTES : HEADER_BYTES + length])
    del buffer[: HEADER_BYTES + length]
    message = json.loads(body)
    if not isinstance(message, dict):
        raise ValueError("a message must be a JSON object")
    return message


def send(sock: socket.socket, message: dict[str, Any], fds: list[int] | None = None) -> None:
    """One message, its descriptors on its first bytes (blocking socket)."""
    data = encode(message)
    sent = socket.send_fds(sock, [data], fds) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def receive(sock: socket.socket, buffer: bytearray | None = None) -> dict[str, Any]:
    """The next message (blocking socket); ConnectionError when the peer hung up. Give the
    connection's own `buffer` where answers may come back to back (pipelined requests):
    bytes read past this message stay there for the next call."""
    buffer = bytearray() if buffer is None else buffer
    while True:
        message = take_message(buffer)
        if message is not None:
            return message
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the daemon closed the shared-memory connection")
        buffer += chunk
