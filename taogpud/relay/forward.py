"""The relay's ASGI side: who may call, the answer streamed to the client, one trace line.

    Relay.serve(scope, receive, send, path, uid)   one request, whoever let it in
    UnixRelay    /relay/... on the daemon's socket: the caller is SO_PEERCRED's uid
    TcpRelay     the loopback listener: the Host must be its own, the caller a relay token

Answers of the relay itself use the API's one error shape {code, message, hint}; answers of
the provider go to the client as they came, a stream piece by piece as it arrives, with the
key scrubbed from every header and every body (scrub.py: an error body is read whole and its
masked forms go too). A client that hangs up cancels the upstream request.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import time
from collections.abc import Callable, Coroutine, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import aiohttp
import orjson
from starlette.types import ASGIApp, Receive, Scope, Send

from taogpud import wire
from taogpud.config import ConfigSnapshot, RelayLimits, RelaySection
from taogpud.doors.http import abandon_response, claim_connection, too_many
from taogpud.doors.noise import Noise
from taogpud.errors import ClientGone, ErrorBody, NoWebSocket, RelayError, UpstreamFailed
from taogpud.host.unix_socket import peer_in
from taogpud.i18n import Text, accepted_language, render
from taogpud.observability import trace
from taogpud.observability.logging import get_logger, request_trace_enabled
from taogpud.provider import http
from taogpud.provider.channel import ChannelSettings, Scrubber, public_url
from taogpud.relay import upstream, websocket
from taogpud.relay.limits import Limiter
from taogpud.relay.scrub import KeyBytes
from taogpud.relay.tokens import TokenStore
from taogpud.relay.tools import tool_of
from taogpud.relay.usage import MAX_JSON_BYTES, StreamUsage, Tokens, UseKey, UseTable, usage_of_json

ERROR_HEADER = b"x-taogpud-error"  # on the relay's own error answers: its code
log = get_logger("taogpud.relay")
# On the Unix socket: /relay/v1/chat/completions → {base}/v1/chat/completions.
PREFIX = wire.RELAY_PREFIX
CLIENT_CLOSED = 499  # nginx's "client closed request"
MAX_ERROR_BYTES = 1 << 20  # an upstream error body is read whole, to scrub the key from it
DROPPED_RESPONSE_HEADERS = frozenset(
    {b"connection", b"keep-alive", b"transfer-encoding", b"set-cookie", b"content-length"}
)


@dataclass
class Exchange:
    """What one request did: the fields of its trace line."""

    uid: int | None
    via: str  # "unix" | "tcp"
    method: str
    path: str
    tool: str
    raw_path: str = ""  # the path as the client encoded it: what goes upstream
    started: float = field(default_factory=time.perf_counter)
    status: int = 0
    code: str | None = None  # the relay's own error code, when it answered itself
    alias: str | None = None
    model: str | None = None
    attempts: int = 0
    ttfb_ms: float | None = None
    bytes_in: int = 0
    bytes_out: int = 0
    tokens: Tokens = field(default_factory=Tokens)
    hung_up: bool = False
    stream: bool = False
    session: dict[str, Any] | None = None  # a WebSocket session's messages, turns and close
    on_end: Callable[[], None] | None = None  # once, just before the answer's last byte
    language: str | None = None  # the client's Accept-Language, for the relay's own errors

    def end(self) -> None:
        """The answer is about to be whole: free the user's slot and count the tokens now,
        so that a client's next request (sent as soon as it has the last byte) sees both."""
        hook, self.on_end = self.on_end, None
        if hook is not None:
            hook()


@dataclass(frozen=True)
class Channel:
    """What every request of one config snapshot shares: settings, key scrubbers, proxy."""

    settings: ChannelSettings
    scrub: Scrubber  # texts: the relay's messages, a provider's error body
    key_bytes: KeyBytes  # bytes: the provider's headers and bodies
    proxy: str | None
    host: str  # the trace's `channel`: the base URL's host, without any credentials


class Relay:
    """The channel for AI tools. One per daemon; shared by the Unix mount and the TCP listener."""

    def __init__(self, snapshot: Callable[[], ConfigSnapshot], tokens: TokenStore) -> None:
        self._snapshot = snapshot
        self.tokens = tokens
        self.limiter = Limiter()
        self.noise = Noise()  # refusals of callers without a uid, as summaries
        self.use = UseTable()
        self.tcp_address: str | None = None  # "127.0.0.1:PORT" once the listener is bound
        self._rng = random.Random()
        self._client: aiohttp.ClientSession | None = None  # made on the loop, when first used
        self._channel: tuple[ConfigSnapshot, Channel] | None = None

    def settings(self) -> RelaySection:
        return self._snapshot().config.relay

    def snapshot(self) -> ConfigSnapshot:
        return self._snapshot()

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()

    def _session(self) -> aiohttp.ClientSession:
        if self._client is None:
            self._client = http.new_session()
        return self._client

    def _channel_of(self, snapshot: ConfigSnapshot) -> Channel:
        """The channel as this config snapshot has it, built once per snapshot (a reload makes
        a new one): building it costs more than the rest of a request."""
        cached = self._channel
        if cached is None or cached[0] is not snapshot:
            settings = ChannelSettings.from_snapshot(snapshot)
            scrub = Scrubber(settings.api_key)
            channel = Channel(
                settings,
                scrub,
                KeyBytes(scrub.forms),
                http.proxy_for(settings.base_url),
                _channel_host(settings.base_url),
            )
            cached = self._channel = (snapshot, channel)
        return cached[1]

    async def serve(
        self, scope: Scope, receive: Receive, send: Send, path: str, uid: int | None, via: str
    ) -> None:
        exchange = self._exchange(scope, path, uid, via)
        snapshot = self._snapshot()
        try:
            if not snapshot.config.relay.enabled:
                raise RelayError(404, _disabled())
            _check_path(exchange.raw_path)
            _check_headers(scope["headers"])
            limit = snapshot.config.relay.max_body_mb << 20
            _check_declared_length(scope, limit)  # before a byte of the body is read
            await self._admitted(scope, receive, send, exchange, snapshot, limit)
        except RelayError as exc:
            await _answer_error(send, exc, exchange)
        except ClientGone:  # nobody to answer: one line, no traceback
            exchange.status, exchange.hung_up = CLIENT_CLOSED, True
            log.info("relay.client_gone", uid=exchange.uid, via=via, bytes_in=exchange.bytes_in)
        except Exception as exc:  # a bug: the one error shape, not uvicorn's plain-text 500
            if exchange.status:
                raise  # the answer has begun: nothing to say in its place
            await _answer_error(send, _internal_error(exc, exchange, snapshot), exchange)
        finally:
            self._finish(exchange, snapshot)

    async def _admitted(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        snapshot: ConfigSnapshot,
        limit: int,
    ) -> None:
        """The user's limits first, then the body: a user over them never has one buffered."""
        over = self.limiter.admit(exchange.uid, snapshot.config.relay.limits)
        if over is not None:
            hint = f"wait {over.retry_after_s} s, or ask the admin about [relay.limits]"
            raise RelayError(429, ErrorBody("relay_limit", over.message, hint), over.retry_after_s)
        exchange.on_end = lambda: self._ended(exchange)
        try:
            body = await _read_body(receive, limit, exchange)
            forwarding = self._forward(scope, send, body, exchange, snapshot)
            await _until_hang_up(receive, forwarding, exchange)
        finally:
            exchange.end()

    def _ended(self, exchange: Exchange) -> None:
        self.limiter.release(exchange.uid)
        if exchange.tokens.seen:
            self.limiter.add_tokens(exchange.uid, exchange.tokens.total)

    async def _forward(
        self, scope: Scope, send: Send, body: bytes, exchange: Exchange, snapshot: ConfigSnapshot
    ) -> None:
        channel = self._channel_of(snapshot)
        settings, scrub = channel.settings, channel.scrub
        _require_key(settings)
        aliased = upstream.resolve_alias(body, settings.models)
        exchange.alias, exchange.model = aliased.alias, aliased.model
        family = upstream.family_of(exchange.path, scope["headers"])
        key = http.key_header(settings.api_key, snapshot.config.relay.key_header, family)
        out = upstream.Outgoing(
            exchange.method,
            upstream.upstream_url(settings.base_url, exchange.raw_path, scope["query_string"]),
            upstream.request_headers(scope["headers"], key),
            aliased.body,
            settings.timeout_s,
            settings.max_retries,
            channel.proxy,
        )
        try:
            opened = await upstream.open_upstream(self._session(), out, self._rng)
        except UpstreamFailed as exc:
            exchange.attempts = exc.attempts
            body_ = ErrorBody(exc.code, scrub(exc.message), exc.hint)
            raise RelayError(exc.status, body_) from None
        exchange.attempts = opened.attempts
        response = opened.response
        try:
            await _relay_response(response, send, exchange, family, channel)
        finally:
            response.close()  # a whole answer's connection is back in the pool already

    async def serve_websocket(
        self, scope: Scope, receive: Receive, send: Send, path: str, uid: int | None, via: str
    ) -> None:
        """A WebSocket upgrade (the Responses API's WebSocket mode, Codex's first choice):
        let in like any request, limited as one request for its whole session (its tokens
        counted turn by turn), traced as one line when it ends."""
        exchange = self._exchange(scope, path, uid, via)
        exchange.method, exchange.stream = "WEBSOCKET", True
        snapshot = self._snapshot()
        try:
            if (await receive())["type"] != "websocket.connect":
                return
            if not snapshot.config.relay.enabled:
                raise RelayError(404, _disabled())
            _check_path(exchange.raw_path)
            _check_headers(scope["headers"])
            over = self.limiter.admit(uid, snapshot.config.relay.limits)
            if over is not None:
                hint = f"wait {over.retry_after_s} s, or ask the admin about [relay.limits]"
                body = ErrorBody("relay_limit", over.message, hint)
                raise RelayError(429, body, over.retry_after_s)
            exchange.on_end = lambda: self.limiter.release(uid)
            try:
                await self._websocket_session(scope, receive, send, exchange, snapshot)
            finally:
                exchange.end()
        except RelayError as exc:
            await _refuse_websocket(scope, send, exc, exchange)
        except Exception as exc:  # a bug: the one error shape, not uvicorn's plain-text 500
            if exchange.status:
                raise
            await _refuse_websocket(scope, send, _internal_error(exc, exchange, snapshot), exchange)
        finally:
            self._finish(exchange, snapshot)

    async def _websocket_session(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        exchange: Exchange,
        snapshot: ConfigSnapshot,
    ) -> None:
        channel = self._channel_of(snapshot)
        settings = channel.settings
        _require_key(settings)
        family = upstream.family_of(exchange.path, scope["headers"])
        key = http.key_header(settings.api_key, snapshot.config.relay.key_header, family)
        headers, protocols = websocket.handshake_headers(scope["headers"], key)
        url = upstream.upstream_url(settings.base_url, exchange.raw_path, scope["query_string"])
        exchange.attempts = 1
        try:
            provider = await websocket.open_upstream(
                self._session(), url, headers, protocols, settings.timeout_s, channel.proxy
            )
        except NoWebSocket as exc:
            said = ErrorBody(exc.code, channel.scrub(exc.message), exc.hint)
            raise RelayError(exc.status, said) from None
        exchange.status = 101
        await send({"type": "websocket.accept", "subprotocol": provider.protocol})
        turns = _SessionTurns(self.limiter, exchange, snapshot.config.relay.limits, settings.models)
        session = await websocket.relay_frames(
            receive, send, provider, turns.rewrite, channel.scrub, turns.may_go_on
        )
        turns.credit(session)
        exchange.tokens = session.tokens
        exchange.session = {
            "messages_in": session.messages_in,
            "messages_out": session.messages_out,
            "turns": session.turns,
            "closed_by": session.closed_by,
            "close_code": session.close_code,
        }

    async def refuse_websocket(self, scope: Scope, send: Send, exc: RelayError) -> None:
        """Answer an upgrade the listener turned away (no token, a foreign Host): an HTTP
        error in the one shape, counted as `refuse` counts (no uid: never traced)."""
        exchange = self._exchange(scope, scope["path"], None, "tcp")  # never traced
        exchange.method = "WEBSOCKET"
        await _refuse_websocket(scope, send, exc, exchange)
        self.noise.note("info", "relay.refused", via="tcp", uid=None, code=exc.body.code)
        self.use.record(UseKey(None, "-", exchange.status), exchange.tokens)

    async def refuse(self, scope: Scope, send: Send, exc: RelayError) -> None:
        """Answer a request the listener turned away before reading it: a caller without a
        uid, so counted into a summary line (doors/noise.py), never traced with its path or
        User-Agent, which every member could read."""
        exchange = self._exchange(scope, scope["path"], None, "tcp")  # never traced
        await _answer_error(send, exc, exchange)
        self.noise.note("info", "relay.refused", via="tcp", uid=None, code=exc.body.code)
        self.use.record(UseKey(None, "-", exchange.status), exchange.tokens)

    def _exchange(self, scope: Scope, path: str, uid: int | None, via: str) -> Exchange:
        headers = dict(scope["headers"])
        user_agent = headers.get(b"user-agent", b"").decode("latin-1")
        tool = tool_of(user_agent, headers.get(b"x-title", b"").decode("latin-1"))
        raw_path = raw_path_of(scope, PREFIX if via == "unix" else "")
        language = accepted_language(headers.get(b"accept-language", b"").decode("latin-1"))
        method = scope.get("method", "GET")
        return Exchange(uid, via, method, path, tool, raw_path, language=language)

    def _finish(self, exchange: Exchange, snapshot: ConfigSnapshot) -> None:
        model = exchange.model or "-"
        self.use.record(UseKey(exchange.uid, model, exchange.status), exchange.tokens)
        if request_trace_enabled():
            trace.deferred(
                "info" if exchange.status < 500 else "warning",
                "relay.request",
                **trace_fields(exchange, snapshot.key_source, self._channel_of(snapshot).host),
            )


class _SessionTurns:
    """A WebSocket session's turns against the limits: the tokens counted so far credited to
    the user before each new client message, which the day's budget may then refuse; each
    client message's model alias resolved."""

    def __init__(
        self,
        limiter: Limiter,
        exchange: Exchange,
        limits: RelayLimits,
        models: Mapping[str, str],
    ) -> None:
        self.limiter = limiter
        self.exchange = exchange
        self.limits = limits
        self.models = models
        self.credited = 0

    def credit(self, session: websocket.Session) -> None:
        total = session.tokens.total
        if total > self.credited:
            self.limiter.add_tokens(self.exchange.uid, total - self.credited)
            self.credited = total

    def may_go_on(self, session: websocket.Session) -> str | None:
        self.credit(session)
        over = self.limiter.tokens_over(self.exchange.uid, self.limits)
        return None if over is None else over.message

    def rewrite(self, text: bytes) -> bytes:
        aliased = upstream.resolve_alias(text, self.models)
        self.exchange.alias = aliased.alias or self.exchange.alias
        self.exchange.model = aliased.model or self.exchange.model
        return aliased.body


def _require_key(settings: ChannelSettings) -> None:
    """A daemon without a key forwards nothing: the provider's 401 for a request sent keyless
    hid the cause (503 no_key names where the key was looked for and how to give it)."""
    if settings.api_key is None:
        raise RelayError(503, ErrorBody("no_key", *settings.no_key()))


def trace_fields(exchange: Exchange, key_source: str, channel: str) -> dict[str, Any]:
    return {
        "uid": exchange.uid,
        "via": exchange.via,
        "tool": exchange.tool,
        "method": exchange.method,
        "path": exchange.path,
        "alias": exchange.alias,
        "model": exchange.model,
        "status": exchange.status,
        "code": exchange.code,
        "stream": exchange.stream,
        "attempts": exchange.attempts,
        "ttfb_ms": exchange.ttfb_ms,
        "total_ms": round((time.perf_counter() - exchange.started) * 1e3, 3),
        "bytes_in": exchange.bytes_in,
        "bytes_out": exchange.bytes_out,
        "tokens": exchange.tokens.as_dict(),
        "hung_up": exchange.hung_up,
        "channel": channel,
        "key_source": key_source,
    } | ({} if exchange.session is None else {"session": exchange.session})


def raw_path_of(scope: Scope, prefix: str = "") -> str:
    """The path as the client sent it, less `prefix`, for upstream: percent-escapes kept
    (`%2F` is not `/`), where ASGI's `path` is decoded. Without a raw_path that starts with
    the prefix, the decoded path is quoted again."""
    raw = scope.get("raw_path")
    if isinstance(raw, bytes) and raw.startswith(prefix.encode() + b"/"):
        return raw[len(prefix) :].decode("latin-1")
    return quote(scope["path"][len(prefix) :], safe="/:@!$&'()*+,;=-._~")


def _channel_host(base_url: str) -> str:
    return public_url(base_url).split("//", 1)[-1].split("/", 1)[0]


# ---- the request and the answer -----------------------------------------------------------


def _check_declared_length(scope: Scope, limit: int) -> None:
    for name, value in scope["headers"]:
        if name == b"content-length" and value.strip().isdigit() and int(value) > limit:
            said = Text(
                "the request body declares {count} bytes, over the relay's limit of {mib} MiB",
                count=int(value),
                mib=limit >> 20,
            )
            raise RelayError(413, ErrorBody("body_too_large", said, _SEND_LESS))


_SEND_LESS = Text("send less, or raise [relay] max_body_mb in config.toml")


async def _read_body(receive: Receive, limit: int, exchange: Exchange) -> bytes:
    pieces: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise ClientGone
        piece = message.get("body", b"")
        exchange.bytes_in += len(piece)
        if exchange.bytes_in > limit:
            said = Text("the request body passed the relay's limit of {mib} MiB", mib=limit >> 20)
            raise RelayError(413, ErrorBody("body_too_large", said, _SEND_LESS))
        pieces.append(piece)
        if not message.get("more_body", False):
            return b"".join(pieces)


async def _until_hang_up(
    receive: Receive, forwarding: Coroutine[Any, Any, None], exchange: Exchange
) -> None:
    """Run `forwarding` in this task until it ends or the client hangs up; a hang-up cancels
    it, and with it the upstream request (its connection is closed as the response is).

    One watcher task waits on `receive`; the work stays in the request's own task (a second
    task for it, and asyncio.wait over both, cost more than the rest of the relay's code)."""
    task = asyncio.current_task()
    assert task is not None
    finished = False

    def on_disconnect(watch: asyncio.Task[None]) -> None:
        # after the answer's last byte (on_end spent) a disconnect is the normal end
        if finished or watch.cancelled() or watch.exception() is not None:
            return
        if exchange.on_end is not None:
            exchange.hung_up = True
            task.cancel()

    watch = asyncio.get_running_loop().create_task(_disconnect(receive))
    watch.add_done_callback(on_disconnect)
    try:
        await forwarding
    except asyncio.CancelledError:
        if not exchange.hung_up or task.uncancel() > 0:
            raise  # the daemon is stopping, not the client
        exchange.status = exchange.status or CLIENT_CLOSED
    finally:
        finished = True
        watch.cancel()


async def _disconnect(receive: Receive) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass


async def _relay_response(
    response: aiohttp.ClientResponse, send: Send, exchange: Exchange, family: str, channel: Channel
) -> None:
    if response.status >= 400:
        await _relay_error_answer(response, send, exchange, channel)
        return
    content_type = response.headers.get("content-type", "")
    exchange.stream = content_type.startswith("text/event-stream")
    exchange.status = response.status
    await send(
        {
            "type": "http.response.start",
            "status": response.status,
            "headers": _response_headers(response, channel.key_bytes, not exchange.stream),
        }
    )
    if exchange.stream:
        await _relay_stream(response, send, exchange, family, channel)
    else:
        await _relay_body(response, send, exchange, channel.key_bytes)


async def _relay_body(
    response: aiohttp.ClientResponse, send: Send, exchange: Exchange, key_bytes: KeyBytes
) -> None:
    kept: list[bytes] = []  # for its usage; a huge answer (embeddings) is not kept
    scrub = key_bytes.stream()
    try:
        async for piece in response.content.iter_any():
            await _send_piece(send, exchange, scrub.feed(piece), kept)
    except (aiohttp.ClientError, TimeoutError) as exc:  # the provider hung up mid-body
        _upstream_gone(exchange, exc)
        return
    await _send_piece(send, exchange, scrub.end(), kept)
    if exchange.bytes_out <= MAX_JSON_BYTES:
        usage_of_json(b"".join(kept), exchange.tokens)
    exchange.end()
    await send({"type": "http.response.body", "body": b"", "more_body": False})


async def _send_piece(send: Send, exchange: Exchange, piece: bytes, kept: list[bytes]) -> None:
    if not piece:
        return
    _count_out(exchange, piece)
    if exchange.bytes_out <= MAX_JSON_BYTES:
        kept.append(piece)
    await send({"type": "http.response.body", "body": piece, "more_body": True})


async def _relay_stream(
    response: aiohttp.ClientResponse, send: Send, exchange: Exchange, family: str, channel: Channel
) -> None:
    usage = StreamUsage(exchange.tokens)
    provider_error = False
    scrub = channel.key_bytes.stream()
    try:
        async for came in response.content.iter_any():
            piece = scrub.feed(came)
            if not piece:
                continue  # all of it held back: it may be the start of the key
            _count_out(exchange, piece)
            usage.feed(piece)
            provider_error = provider_error or b"event: error" in piece or b'"error"' in piece
            await send({"type": "http.response.body", "body": piece, "more_body": True})
            if usage.ended:  # the client has the whole answer: leaving now is no hang-up
                exchange.end()
    except (aiohttp.ClientError, TimeoutError) as exc:  # the provider failed mid-stream
        exchange.code = "upstream_broken"
        if not provider_error:
            said = channel.scrub(f"the provider's stream broke: {type(exc).__name__}")
            event = scrub.end() + _error_event(family, said)
            exchange.bytes_out += len(event)
            await send({"type": "http.response.body", "body": event, "more_body": True})
    tail = scrub.end()  # empty unless the stream ended on what could start the key
    exchange.bytes_out += len(tail)
    usage.feed(tail)
    exchange.end()
    await send({"type": "http.response.body", "body": tail, "more_body": False})


def _upstream_gone(exchange: Exchange, exc: BaseException) -> None:
    """The answer cannot be finished: it is left unfinished, so that the client sees it cut
    (uvicorn closes the connection) rather than a short body taken for whole. One line."""
    exchange.code = "upstream_broken"
    log.info(
        "relay.upstream_gone",
        uid=exchange.uid,
        status=exchange.status,
        bytes_out=exchange.bytes_out,
        error=type(exc).__name__,
    )
    abandon_response()


def _error_event(family: str, message: str) -> bytes:
    """The event each family's SDK raises on: anthropic's `event: error`, OpenAI's error data."""
    if family == "anthropic":
        payload = {"type": "error", "error": {"type": "api_error", "message": message}}
        return b"event: error\ndata: " + orjson.dumps(payload) + b"\n\n"
    payload_openai = {"error": {"message": message, "type": "server_error", "code": "relay"}}
    return b"data: " + orjson.dumps(payload_openai) + b"\n\n"


async def _relay_error_answer(
    response: aiohttp.ClientResponse, send: Send, exchange: Exchange, channel: Channel
) -> None:
    """The provider's error, whole, with the key scrubbed out (providers echo what they got)."""
    raw = b""
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):  # cut short: what came
        async for piece in response.content.iter_any():
            raw += piece
            if len(raw) > MAX_ERROR_BYTES:
                break
    body = channel.scrub(raw[:MAX_ERROR_BYTES].decode("utf-8", "replace")).encode()
    exchange.status = response.status
    headers = _response_headers(response, channel.key_bytes, keep_length=False)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    _count_out(exchange, body)
    exchange.end()
    await send({"type": "http.response.body", "body": body, "more_body": False})


def _count_out(exchange: Exchange, piece: bytes) -> None:
    if exchange.ttfb_ms is None:
        exchange.ttfb_ms = round((time.perf_counter() - exchange.started) * 1e3, 3)
    exchange.bytes_out += len(piece)


def _response_headers(
    response: aiohttp.ClientResponse, key_bytes: KeyBytes, keep_length: bool
) -> list[tuple[bytes, bytes]]:
    """The provider's headers, less hop-by-hop ones, cookies and any CORS header (a page in a
    browser must not be let read the relay's answers), the key scrubbed from the rest."""
    kept: list[tuple[bytes, bytes]] = []
    for name, value in response.raw_headers:
        lower = name.lower()
        if lower.startswith(b"access-control-"):
            continue
        if lower in DROPPED_RESPONSE_HEADERS and not (keep_length and lower == b"content-length"):
            continue
        kept.append((key_bytes.whole(lower), key_bytes.whole(value)))
    return kept


async def _answer_error(send: Send, exc: RelayError, exchange: Exchange) -> None:
    exchange.status, exchange.code = exc.status, exc.body.code
    payload, headers = _error_answer(exc, exchange)
    await send({"type": "http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "http.response.body", "body": payload, "more_body": False})


def _error_answer(exc: RelayError, exchange: Exchange) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """The relay's own answer: the one error shape (its message and hint in the client's
    Accept-Language, as the API's) and the headers that name it; counted as bytes out."""
    body = exc.body
    said = ErrorBody(
        body.code, render(body.message, exchange.language), render(body.hint, exchange.language)
    )
    payload = orjson.dumps(said.as_dict())
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", b"%d" % len(payload)),
        (ERROR_HEADER, body.code.encode()),
    ]
    if exc.retry_after_s is not None:
        headers.append((b"retry-after", str(exc.retry_after_s).encode()))
    exchange.bytes_out += len(payload)
    return payload, headers


async def _refuse_websocket(scope: Scope, send: Send, exc: RelayError, exchange: Exchange) -> None:
    """An upgrade refused before it was accepted: the HTTP answer of the one error shape (the
    ASGI server's websocket.http.response extension), so the client sees why at once; where
    the server lacks it, a close (403)."""
    exchange.status, exchange.code = exc.status, exc.body.code
    if "websocket.http.response" not in scope.get("extensions", {}):
        await send({"type": "websocket.close", "code": websocket.POLICY_CLOSE})
        return
    payload, headers = _error_answer(exc, exchange)
    await send({"type": "websocket.http.response.start", "status": exc.status, "headers": headers})
    await send({"type": "websocket.http.response.body", "body": payload})


def _internal_error(exc: Exception, exchange: Exchange, snapshot: ConfigSnapshot) -> RelayError:
    """Logged with its traceback (called from the except block), answered as a 500."""
    log.exception("relay.unexpected_error", path=exchange.path)
    said = Scrubber(snapshot.api_key)(f"{type(exc).__name__}: {exc}")
    body = ErrorBody("internal_error", said, "this is a bug in taogpud; the log has the traceback")
    return RelayError(500, body)


def _check_path(raw_path: str) -> None:
    """Refuse, before anything is read or forwarded, a path that could leave the base."""
    why = upstream.outside_base(raw_path)
    if why is not None:
        raise RelayError(
            400,
            ErrorBody(
                "path_outside_base",
                f"the relay forwards paths under provider.baseUrl only; {raw_path[:200]!r} "
                f"has {why}",
                "send the path without '.' or '..' segments (plain or percent-encoded) and "
                "without encoded slashes (%2F, %5C)",
            ),
        )


def _check_headers(headers: list[tuple[bytes, bytes]]) -> None:
    """Refuse a header the relay could not forward as the same bytes."""
    name = upstream.not_utf8_header(headers)
    if name is not None:
        raise RelayError(
            400,
            ErrorBody(
                "header_not_utf8",
                f"the value of the header {name[:100]!r} is not UTF-8; the relay forwards "
                "header bytes as they are, and can do so for UTF-8 (and ASCII) only",
                f"send {name[:100]} as UTF-8 (or percent-encode it)",
            ),
        )


def _disabled() -> ErrorBody:
    return ErrorBody(
        "relay_disabled",
        Text("the relay is off on this daemon"),
        Text("set enabled = true in the [relay] table of config.toml and restart taogpud"),
    )


# ---- the two ways in ----------------------------------------------------------------------


class UnixRelay:
    """/relay/... on the daemon's Unix socket, in front of the API app; other paths pass on.
    Who: whoever could open the socket (0660 root:taogpu), by SO_PEERCRED, as for jobs."""

    def __init__(self, app: ASGIApp, relay: Relay) -> None:
        self.app = app
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] not in ("http", "websocket") or not path.startswith(PREFIX + "/"):
            await self.app(scope, receive, send)
            return
        uid = peer_in(scope).uid
        serve = self.relay.serve if scope["type"] == "http" else self.relay.serve_websocket
        await serve(scope, receive, send, path[len(PREFIX) :], uid, "unix")


class TcpRelay:
    """The loopback TCP listener's app: every path is the provider's.

    A browser page can reach 127.0.0.1 too, through a name it controls (DNS rebinding):
    the Host must be this listener's own address and port, and no CORS header is ever sent.
    The caller is the uid whose relay token the request carries, as `Authorization: Bearer`
    or `x-api-key` (where each tool puts its "API key")."""

    def __init__(self, relay: Relay) -> None:
        self.relay = relay

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            return
        try:
            self._check_host(scope)
            uid = self._caller(scope)
            if not claim_connection(scope, uid):  # from the budget without a uid to its own
                raise RelayError(503, too_many(uid))
        except RelayError as exc:
            refuse = self.relay.refuse if kind == "http" else self.relay.refuse_websocket
            await refuse(scope, send, exc)
            return
        serve = self.relay.serve if kind == "http" else self.relay.serve_websocket
        await serve(scope, receive, send, scope["path"], uid, "tcp")

    def _check_host(self, scope: Scope) -> None:
        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        own = self.relay.tcp_address or ""
        allowed = {own, f"localhost:{own.rpartition(':')[2]}"}
        if host not in allowed:
            raise RelayError(
                421,
                ErrorBody(
                    "wrong_host",
                    Text(
                        "the relay answers for Host {own} only, not {host}",
                        own=own,
                        host=repr(host[:100]),
                    ),
                    Text(
                        "send requests to http://{own}/ (a web page cannot use the relay)", own=own
                    ),
                ),
            )

    def _caller(self, scope: Scope) -> int:
        """The uid of the first relay token among x-api-key and `Authorization: Bearer`: a
        tool may send both (Claude Code with ANTHROPIC_API_KEY set beside ANTHROPIC_AUTH_TOKEN),
        and the one that is a valid relay token is the one meant for the relay."""
        offered = _offered_tokens(scope["headers"])
        for token in offered:
            uid = self.relay.tokens.uid_of(token)
            if uid is not None:
                return uid
        if offered:
            message = Text(
                "the request carries no valid relay token; the relay forwards nothing without one"
            )
        else:
            message = Text(
                "the request carries no relay token; the relay forwards nothing without one"
            )
        hint = Text(
            "use what `taogpuctl relay env --tool TOOL` prints: the tool's base URL and the "
            "token of `taogpuctl relay token` where its API key would go"
        )
        raise RelayError(401, ErrorBody("relay_token_required", message, hint))


def _offered_tokens(headers: list[tuple[bytes, bytes]]) -> list[str]:
    """What a client sent as its API key, in x-api-key and as a Bearer token (both, if both)."""
    offered = []
    for name, value in headers:
        text = value.decode("latin-1").strip()
        if name == b"x-api-key" and text:
            offered.append(text)
        elif name == b"authorization" and text[:7].lower() == "bearer ":
            offered.append(text[7:].strip())
    return offered
