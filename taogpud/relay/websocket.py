"""A WebSocket session through the relay: the Responses API's WebSocket mode (Codex's first
choice), or any other upgrade the provider accepts on a path.

    client ──ASGI websocket──► relay ──aiohttp ws_connect (the key set)──► provider

The upstream socket is opened before the client's is accepted, so a provider that refuses
WebSocket is answered at once with an HTTP error (426 `upstream_no_websocket`) the client can
fall back on. Then frames go both ways as they come, text as text, binary as binary; a text
frame from the client has its model alias resolved (the one rewrite, as for HTTP bodies);
a text frame from the provider is read for usage (each `response.completed` carries its
turn's) and has the key scrubbed out. Whichever side closes, the other is closed with its code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import orjson
from starlette.types import Receive, Send

from taogpud.errors import NoWebSocket
from taogpud.relay import upstream
from taogpud.relay.usage import Tokens, usage_of_event

# the handshake's own headers: aiohttp makes its own for the upstream one
HANDSHAKE_HEADERS = frozenset(
    {
        b"sec-websocket-key",
        b"sec-websocket-version",
        b"sec-websocket-extensions",
        b"sec-websocket-protocol",
    }
)
MAX_MESSAGE_BYTES = 64 << 20  # a Responses event repeats the whole answer: allow a large one
NORMAL_CLOSE = 1000
POLICY_CLOSE = 1008  # a limit reached mid-session
ABNORMAL_CLOSE = 1011


@dataclass
class Session:
    """What one session did, for its trace line and the limits."""

    messages_in: int = 0
    messages_out: int = 0
    turns: int = 0  # answers whose usage came (response.completed and the like)
    tokens: Tokens = field(default_factory=Tokens)
    closed_by: str = ""  # "client" | "provider" | "limit"
    close_code: int = NORMAL_CLOSE


def handshake_headers(
    client_headers: list[tuple[bytes, bytes]], key: list[tuple[str, str]]
) -> tuple[list[tuple[str, str]], list[str]]:
    """The upstream handshake's headers (the client's, less the handshake's own and what the
    relay drops anyway, the key set) and the subprotocols the client asked for."""
    protocols: list[str] = []
    kept: list[tuple[bytes, bytes]] = []
    for name, value in client_headers:
        if name == b"sec-websocket-protocol":
            protocols += [p.strip() for p in value.decode("latin-1").split(",") if p.strip()]
        elif name not in HANDSHAKE_HEADERS:
            kept.append((name, value))
    headers = [h for h in upstream.request_headers(kept, key) if h[0] != "accept-encoding"]
    return headers, protocols


async def open_upstream(
    client: aiohttp.ClientSession,
    url: str,
    headers: list[tuple[str, str]],
    protocols: list[str],
    timeout_s: float,
    proxy: str | None,
) -> aiohttp.ClientWebSocketResponse:
    """The provider's WebSocket, or NoWebSocket saying why not (within `timeout_s`)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await client.ws_connect(
                url,
                headers=headers,
                protocols=protocols,
                proxy=proxy,
                autoping=True,
                max_msg_size=MAX_MESSAGE_BYTES,
                timeout=aiohttp.ClientWSTimeout(ws_receive=None, ws_close=10.0),
            )
    except aiohttp.WSServerHandshakeError as exc:
        raise _refused(exc.status) from None
    except (aiohttp.ClientError, TimeoutError) as exc:
        raise NoWebSocket(
            502,
            "upstream_unreachable",
            f"the relay could not open a WebSocket to the provider ({type(exc).__name__})",
            "check provider.baseUrl, or use HTTP (the tool falls back to it on this error)",
        ) from None


def _refused(status: int) -> NoWebSocket:
    if status in (401, 403, 429):  # the provider's word on the key or the rate: as it said
        return NoWebSocket(
            status,
            "upstream_refused",
            f"the provider refused the WebSocket with {status}",
            "`taogpuctl api ping` checks the key; HTTP requests get the provider's own answer",
        )
    return NoWebSocket(
        426,
        "upstream_no_websocket",
        f"the provider does not take WebSocket here (it answered {status})",
        "use HTTP: the Responses API over SSE does the same (Codex falls back on its own)",
    )


async def relay_frames(
    receive: Receive,
    send: Send,
    provider: aiohttp.ClientWebSocketResponse,
    rewrite: Callable[[bytes], bytes],
    scrub: Callable[[str], str],
    may_go_on: Callable[[Session], str | None],
) -> Session:
    """Frames both ways until either side closes; the session's counts. `rewrite`: a client
    text frame's alias resolved; `may_go_on`: None, or why a new client message is refused
    (a limit: the session is closed with 1008 and that reason)."""
    session = Session()
    inbound = asyncio.ensure_future(
        _client_to_provider(receive, send, provider, rewrite, may_go_on, session)
    )
    outbound = asyncio.ensure_future(_provider_to_client(provider, send, scrub, session))
    try:
        await asyncio.wait((inbound, outbound), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (inbound, outbound):
            task.cancel()
        for task in (inbound, outbound):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await provider.close(code=session.close_code)
    if not session.closed_by or session.closed_by == "provider":
        with contextlib.suppress(Exception):  # the client may be gone already
            await send({"type": "websocket.close", "code": session.close_code})
    return session


async def _client_to_provider(
    receive: Receive,
    send: Send,
    provider: aiohttp.ClientWebSocketResponse,
    rewrite: Callable[[bytes], bytes],
    may_go_on: Callable[[Session], str | None],
    session: Session,
) -> None:
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            code = message.get("code")
            session.closed_by = "client"
            session.close_code = code if isinstance(code, int) else NORMAL_CLOSE
            return
        refused = may_go_on(session)
        if refused is not None:
            session.closed_by, session.close_code = "limit", POLICY_CLOSE
            await send({"type": "websocket.close", "code": POLICY_CLOSE, "reason": refused[:120]})
            return
        session.messages_in += 1
        text, data = message.get("text"), message.get("bytes")
        if isinstance(text, str):
            await provider.send_str(rewrite(text.encode()).decode())
        elif isinstance(data, bytes):
            await provider.send_bytes(data)


async def _provider_to_client(
    provider: aiohttp.ClientWebSocketResponse,
    send: Send,
    scrub: Callable[[str], str],
    session: Session,
) -> None:
    async for message in provider:
        if message.type == aiohttp.WSMsgType.TEXT:
            text = scrub(message.data)
            _count_usage(text, session)
            session.messages_out += 1
            await send({"type": "websocket.send", "text": text})
        elif message.type == aiohttp.WSMsgType.BINARY:
            session.messages_out += 1
            await send({"type": "websocket.send", "bytes": message.data})
        else:
            break
    session.closed_by = "provider"
    code = provider.close_code
    session.close_code = code if code and code != 1005 else NORMAL_CLOSE
    if provider.exception() is not None:
        session.close_code = ABNORMAL_CLOSE


def _count_usage(text: str, session: Session) -> None:
    """Each answer's usage (in its last event) added to the session's: a session is many turns."""
    if '"usage"' not in text:
        return
    try:
        event = orjson.loads(text)
    except orjson.JSONDecodeError:
        return
    if not isinstance(event, dict):
        return
    turn = Tokens()
    usage_of_event(event, turn)
    if turn.seen:
        session.turns += 1
        session.tokens.input += turn.input
        session.tokens.output += turn.output
        session.tokens.seen = True
