"""A real OpenAI-compatible HTTP server on 127.0.0.1 for the API channel's tests.

It answers POST .../v1/chat/completions from a script of replies (then a default one) and
records what it received. It checks the Authorization header itself and keeps only whether
it matched: the key is never stored, printed or compared outside the server.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes | dict[str, Any] | None = None  # None: a chat completion
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0


OK = Reply()


def completion(model: str = "claude-sonnet", content: str = "pong") -> dict[str, Any]:
    return {
        "id": "chatcmpl-test",
        "object": "chat.completion",
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it: the key itself is not kept."""

    path: str
    has_auth: bool
    auth_matches: bool  # Authorization == "Bearer <expected key>"
    body: Any


class FakeProvider:
    def __init__(self, expected_key: str | None) -> None:
        self._expected = None if expected_key is None else f"Bearer {expected_key}"
        self.script: list[Reply] = []
        self.default = OK
        self.require_auth = False  # True: a request without the expected key gets a 401
        self.seen: list[Seen] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.port = self.server.server_address[1]

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def next_reply(self) -> Reply:
        with self._lock:
            return self.script.pop(0) if self.script else self.default

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        provider = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                auth = self.headers.get("Authorization")
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                matches = provider._expected is not None and auth == provider._expected
                with provider._lock:
                    provider.seen.append(Seen(self.path, auth is not None, matches, body))
                if provider.require_auth and not matches:
                    # as real providers do, the refusal echoes what it got: the channel must
                    # keep that out of everything it shows
                    message = f"Incorrect API key provided: {auth}"
                    reply = Reply(401, {"error": {"message": message, "type": "auth_error"}})
                else:
                    reply = provider.next_reply()
                asked = body.get("model") if isinstance(body, dict) else None
                self._send(reply, asked if isinstance(asked, str) else "claude-sonnet")

            def _send(self, reply: Reply, model: str) -> None:
                time.sleep(reply.delay_s)
                if reply.body is None:
                    payload = json.dumps(completion(model)).encode()  # echoes the model asked
                elif isinstance(reply.body, dict):
                    payload = json.dumps(reply.body).encode()
                else:
                    payload = reply.body
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test): nothing to answer

        return Handler

    def start(self) -> None:
        threading.Thread(target=self.server.serve_forever, args=(0.02,), daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def fake_provider(expected_key: str | None) -> Iterator[FakeProvider]:
    provider = FakeProvider(expected_key)
    provider.start()
    try:
        yield provider
    finally:
        provider.stop()


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then released)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
