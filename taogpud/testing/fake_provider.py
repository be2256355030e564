"""A real OpenAI- and Anthropic-compatible HTTP server on 127.0.0.1: the provider the tests
and the relay bench (bench/relay.py) talk to.

It answers POST (and GET) on any path from a script of replies (then a default one) and
records what it received. It checks the Authorization and x-api-key headers itself and keeps
only whether they matched: the key is never stored, printed or compared outside the server.
A reply with `events` is a server-sent-event stream, chunked, one chunk per event as the
real providers send them; `break_after` drops the connection mid-stream (no last chunk).
A reply with `echo` repeats the credentials it got, as a provider's debugging echo might: in
its body or events (for `@AUTH@` and `@XKEY@`) and in its headers, each event that holds one
written as two chunks split inside it.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from websockets.frames import Frame, Opcode
from websockets.http11 import Request
from websockets.protocol import State as WsState
from websockets.server import ServerProtocol


class _Server(ThreadingHTTPServer):
    request_queue_size = 256  # 64 clients connecting at once (the bench): not socketserver's 5


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes | dict[str, Any] | None = None  # None: a chat completion
    headers: dict[str, str] = field(default_factory=dict)
    delay_s: float = 0.0
    events: tuple[bytes, ...] | None = None  # an SSE stream instead of a body
    event_delay_s: float = 0.0  # after each event
    end_delay_s: float = 0.0  # after the last event, before the stream's end (its last chunk)
    break_after: int | None = None  # drop the connection after this many events
    echo_auth: bool = False  # a 401 that repeats the credentials it got, as real ones do
    echo: bool = False  # @AUTH@ / @XKEY@ in body and events: the credentials; echo headers too


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


def openai_stream(model: str, words: int = 3, usage: bool = True) -> tuple[bytes, ...]:
    """A chat completion stream as OpenAI sends it: chunks, a usage chunk, [DONE]."""

    def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        body = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model}
        return b"data: " + json.dumps({**body, "choices": [choice]}).encode() + b"\n\n"

    events = [chunk({"role": "assistant", "content": ""})]
    events += [chunk({"content": f"w{i} "}) for i in range(words)]
    events.append(chunk({}, "stop"))
    if usage:
        tail = {"id": "c1", "object": "chat.completion.chunk", "created": 1, "model": model}
        tail |= {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": words}}
        events.append(b"data: " + json.dumps(tail).encode() + b"\n\n")
    return (*events, b"data: [DONE]\n\n")


def anthropic_stream(model: str, words: int = 3) -> tuple[bytes, ...]:
    """A Messages stream as Anthropic sends it: message_start … message_stop."""

    def event(name: str, data: dict[str, Any]) -> bytes:
        return f"event: {name}\ndata: {json.dumps({'type': name, **data})}\n\n".encode()

    message: dict[str, Any] = {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model, "content": [],
        "stop_reason": None, "stop_sequence": None,
        "usage": {"input_tokens": 7, "output_tokens": 1},
    }  # fmt: skip
    events = [
        event("message_start", {"message": message}),
        event("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}}),
    ]
    events += [
        event(
            "content_block_delta", {"index": 0, "delta": {"type": "text_delta", "text": f"w{i} "}}
        )
        for i in range(words)
    ]
    events += [
        event("content_block_stop", {"index": 0}),
        event(
            "message_delta",
            {
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": words},
            },
        ),
        event("message_stop", {}),
    ]
    return tuple(events)


def responses_stream(model: str, words: int = 3, pad: int = 0) -> tuple[bytes, ...]:
    """A Responses API stream as OpenAI sends it (what Codex reads): response.created, the
    message item and its text deltas, response.completed carrying the whole response and its
    usage. `pad`: that many more characters of text in the last delta (a long turn)."""
    deltas = [f"w{i} " for i in range(words)]
    deltas[-1] += "x" * pad
    text = "".join(deltas)
    usage = {"input_tokens": 11, "output_tokens": words, "total_tokens": 11 + words}
    done = responses_object(model, text, usage)
    item = done["output"][0]
    part = item["content"][0]
    where = {"item_id": item["id"], "output_index": 0}
    steps: list[tuple[str, dict[str, Any]]] = [
        (
            "response.created",
            {"response": {**done, "status": "in_progress", "output": [], "usage": None}},
        ),
        ("response.output_item.added", {"output_index": 0, "item": {**item, "content": []}}),
        (
            "response.content_part.added",
            {**where, "content_index": 0, "part": {**part, "text": ""}},
        ),
    ]
    steps += [
        ("response.output_text.delta", {**where, "content_index": 0, "delta": delta})
        for delta in deltas
    ]
    steps += [
        ("response.output_text.done", {**where, "content_index": 0, "text": text}),
        ("response.content_part.done", {**where, "content_index": 0, "part": part}),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": done}),
    ]
    return tuple(_responses_event(index, name, data) for index, (name, data) in enumerate(steps))


def responses_object(model: str, text: str, usage: dict[str, int] | None) -> dict[str, Any]:
    message: dict[str, Any] = {
        "id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }  # fmt: skip
    return {
        "id": "resp_1", "object": "response", "created_at": 1, "model": model,
        "status": "completed", "output": [message], "usage": usage, "parallel_tool_calls": True,
        "tool_choice": "auto", "tools": [],
    }  # fmt: skip


def _responses_event(sequence: int, name: str, data: dict[str, Any]) -> bytes:
    payload = json.dumps({"type": name, "sequence_number": sequence, **data})
    return f"event: {name}\ndata: {payload}\n\n".encode()


def anthropic_message(model: str) -> dict[str, Any]:
    return {
        "id": "msg_1", "type": "message", "role": "assistant", "model": model,
        "content": [{"type": "text", "text": "pong"}], "stop_reason": "end_turn",
        "stop_sequence": None, "usage": {"input_tokens": 3, "output_tokens": 1},
    }  # fmt: skip


@dataclass(frozen=True)
class Seen:
    """One request as the server saw it: the key itself is not kept."""

    path: str
    has_auth: bool
    auth_matches: bool  # Authorization == "Bearer <expected key>"
    body: Any
    method: str = "POST"
    x_api_key_matches: bool = False  # x-api-key == the expected key
    headers: dict[str, str] = field(default_factory=dict)  # the key's own value as "<key>"


class FakeProvider:
    def __init__(self, expected_key: str | None) -> None:
        self._expected = None if expected_key is None else f"Bearer {expected_key}"
        self._expected_raw = expected_key
        self._lock = threading.Lock()
        self.reset()
        self.server = _Server(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.server.block_on_close = False
        self.port = self.server.server_address[1]

    def reset(self) -> None:
        """As it started: no script, the default answers, nothing seen (a provider that the
        tests of a module share is handed to each of them so)."""
        with self._lock:
            self.stream_ends: list[str] = []  # per stream: "complete" | "client_gone" | "broken"
            self.script: list[Reply] = []
            self.default = OK
            self.require_auth = False  # True: a request without the expected key gets a 401
            self.respond: Callable[[Seen], Reply] | None = None  # a reply per request, over script
            self.ws_refuse: int | None = None  # a status: WebSocket upgrades refused with it
            self.ws_words = 3  # words in each WebSocket response
            self.ws_ends: list[str] = []  # per WebSocket session: how it ended
            self.seen: list[Seen] = []

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
            disable_nagle_algorithm = True  # headers and body are separate writes

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:  # Claude Code's preflight: an empty 200
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                if self.headers.get("upgrade", "").lower() == "websocket":
                    self._websocket()
                    return
                self.do_POST()

            def _websocket(self) -> None:
                seen = self._seen(b"")
                if provider.ws_refuse is not None or (
                    provider.require_auth and not (seen.auth_matches or seen.x_api_key_matches)
                ):
                    status = provider.ws_refuse or 401
                    self._send(Reply(status, {"error": {"message": "no websocket here"}}), "m")
                    return
                protocol = ServerProtocol()
                head = "".join(f"{name}: {value}\r\n" for name, value in self.headers.items())
                protocol.receive_data(f"GET {self.path} HTTP/1.1\r\n{head}\r\n".encode())
                (request,) = protocol.events_received()
                assert isinstance(request, Request)  # a server receives a request first
                protocol.send_response(protocol.accept(request))
                self.close_connection = True
                self._pump(protocol)

            def _pump(self, protocol: ServerProtocol) -> None:
                """Frames in, a Responses stream out for each response.create, until closed."""
                end = "client_closed"
                try:
                    while protocol.state is not WsState.CLOSED:
                        self.wfile.write(b"".join(protocol.data_to_send()))
                        self.wfile.flush()
                        data = self.rfile.read1(65536)
                        if not data:
                            protocol.receive_eof()
                            end = "eof" if end == "client_closed" else end
                            break
                        protocol.receive_data(data)
                        for frame in protocol.events_received():
                            if isinstance(frame, Frame) and frame.opcode is Opcode.TEXT:
                                self._ws_answer(protocol, json.loads(bytes(frame.data)))
                    self.wfile.write(b"".join(protocol.data_to_send()))
                except OSError:
                    end = "broken"
                with provider._lock:
                    provider.ws_ends.append(end)

            def _ws_answer(self, protocol: ServerProtocol, event: dict[str, Any]) -> None:
                seen = Seen(self.path, False, False, event, "WS")
                with provider._lock:
                    provider.seen.append(seen)
                model = event.get("model")
                model = model if isinstance(model, str) else "m"
                for sse in responses_stream(model, provider.ws_words):
                    protocol.send_text(sse.split(b"data: ", 1)[1].strip())

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                seen = self._seen(raw)
                if provider.require_auth and not (seen.auth_matches or seen.x_api_key_matches):
                    # as real providers do, the refusal echoes what it got: the channel must
                    # keep that out of everything it shows
                    message = f"Incorrect API key provided: {self.headers.get('Authorization')}"
                    reply = Reply(401, {"error": {"message": message, "type": "auth_error"}})
                elif provider.respond is not None:
                    reply = provider.respond(seen)
                else:
                    reply = provider.next_reply()
                if reply.echo_auth:
                    message = (
                        f"Incorrect API key provided: {self.headers.get('Authorization')} / "
                        f"{self.headers.get('x-api-key')}"
                    )
                    reply = Reply(401, {"error": {"message": message, "type": "auth_error"}})
                body = seen.body
                asked = body.get("model") if isinstance(body, dict) else None
                self._send(reply, asked if isinstance(asked, str) else "claude-sonnet")

            def _seen(self, raw: bytes) -> Seen:
                """Record the request (the key only as whether it matched)."""
                auth = self.headers.get("Authorization")
                x_api_key = self.headers.get("x-api-key")
                self.echoed = {
                    b"@AUTH@": (auth or "").encode(),
                    b"@XKEY@": (x_api_key or "").encode(),
                }
                try:
                    body = json.loads(raw)
                except ValueError:
                    body = raw
                matches = provider._expected is not None and auth == provider._expected
                x_matches = (
                    provider._expected_raw is not None and x_api_key == provider._expected_raw
                )
                headers = {
                    name.lower(): "<key>" if value in (provider._expected, provider._expected_raw)
                    else value
                    for name, value in self.headers.items()
                }  # fmt: skip
                seen = Seen(
                    self.path, auth is not None, matches, body, self.command, x_matches, headers
                )
                with provider._lock:
                    provider.seen.append(seen)
                return seen

            def _echo(self, reply: Reply, data: bytes) -> bytes:
                for mark, value in self.echoed.items() if reply.echo else ():
                    data = data.replace(mark, value)
                return data

            def _echo_headers(self, reply: Reply) -> None:
                if reply.echo:
                    self.send_header("X-Echo-Authorization", self.echoed[b"@AUTH@"].decode())
                    self.send_header("X-Echo-Api-Key", self.echoed[b"@XKEY@"].decode())
                    self.send_header("Location", "/api/v1/?key=" + self.echoed[b"@XKEY@"].decode())

            def _write_chunks(self, reply: Reply, event: bytes) -> None:
                """One event as one chunk, or, holding an echoed credential, as two chunks
                split in the middle of it (apart in time, so they arrive apart)."""
                echoed = self._echo(reply, event)
                value = next((v for m, v in self.echoed.items() if v and m in event), b"")
                middle = echoed.find(value) + len(value) // 2 if reply.echo and value else 0
                for part in (echoed[:middle], echoed[middle:]) if middle else (echoed,):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(part), part))
                    self.wfile.flush()
                    if middle:
                        time.sleep(0.05)

            def _send(self, reply: Reply, model: str) -> None:
                time.sleep(reply.delay_s)
                if reply.events is not None:
                    self._stream(reply)
                    return
                if reply.body is None:
                    payload = json.dumps(completion(model)).encode()  # echoes the model asked
                elif isinstance(reply.body, dict):
                    payload = json.dumps(reply.body).encode()
                else:
                    payload = reply.body
                payload = self._echo(reply, payload)
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self._echo_headers(reply)
                    self.end_headers()
                    self.wfile.write(payload)
                except OSError:
                    pass  # the client gave up (a timeout test): nothing to answer

            def _stream(self, reply: Reply) -> None:
                """Chunked SSE, one chunk per event; `break_after`: close without the end."""
                end = "complete"
                try:
                    self.send_response(reply.status)
                    self.send_header("Content-Type", "text/event-stream")
                    self.send_header("Transfer-Encoding", "chunked")
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self._echo_headers(reply)
                    self.end_headers()
                    for index, event in enumerate(reply.events or ()):
                        if reply.break_after is not None and index >= reply.break_after:
                            end = "broken"
                            break
                        self._write_chunks(reply, event)
                        time.sleep(reply.event_delay_s)
                    else:
                        time.sleep(reply.end_delay_s)
                        self.wfile.write(b"0\r\n\r\n")
                        self.wfile.flush()
                except OSError:
                    end = "client_gone"
                if end != "complete":
                    self.close_connection = True
                    with contextlib.suppress(OSError):
                        self.connection.shutdown(socket.SHUT_RDWR)
                with provider._lock:
                    provider.stream_ends.append(end)

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
