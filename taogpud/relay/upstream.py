"""One forwarded request, up to the provider's response head: headers, aliases, retries.

    the client's head        →  upstream head
    Authorization, x-api-key     removed; the daemon's key in the header the provider expects
    Host, Content-Length,        removed (aiohttp sets its own); hop-by-hop headers removed
    Accept-Encoding              identity: the relay reads usage out of the answer
    everything else              as sent (anthropic-version, OpenAI-Beta, User-Agent, ...)

Deadlines: each attempt must get the response head within the channel's timeout
(min(provider.timeoutMs, api.request_timeout_s)); after it, every gap between two pieces of the
body may last that long (aiohttp's sock_read timeout), so a long stream is never cut while it
flows.
Retries: provider.maxRetries more attempts for a failed connect, a 429 (after its Retry-After)
and a 5xx. They all happen before the client has seen a byte: once the head is forwarded, a
failure is the client's to see.

The client, its timeouts, proxy, TLS and the key's header are the provider's one HTTP client
(taogpud/provider/http.py: aiohttp, measured against httpx in one run), shared with the
channel's ping.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

import aiohttp
import orjson
from yarl import URL

from taogpud.errors import UpstreamFailed
from taogpud.provider import http
from taogpud.provider.http import Backoff, Family, retry_after_s

RETRY_AFTER_MAX_S = 60.0  # a provider asking for a longer wait gets its 429 forwarded instead
BACKOFF = Backoff(base_s=0.25, cap_s=4.0)
DROPPED_REQUEST_HEADERS = frozenset(
    {
        b"authorization",
        b"x-api-key",
        b"host",
        b"content-length",
        b"expect",  # 100-continue is the relay's to answer (uvicorn does, as the body is read)
        b"accept-encoding",
        b"connection",
        b"keep-alive",
        b"proxy-authorization",
        b"proxy-connection",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"cookie",  # a browser's cookies for 127.0.0.1 are nobody's business upstream
        b"origin",
    }
)


def family_of(path: str, headers: Iterable[tuple[bytes, bytes]] = ()) -> Family:
    """Anthropic-style: /v1/messages and below, and any request carrying `anthropic-version`
    (the anthropic SDKs send it everywhere: models.list(), files, batches); the rest is
    OpenAI-style. It picks the key's header and the shape of a relay-made stream error."""
    if path == "/v1/messages" or path.startswith("/v1/messages/"):
        return "anthropic"
    return "anthropic" if any(name == b"anthropic-version" for name, _ in headers) else "openai"


DOT_SEGMENTS = frozenset({".", ".."})
DECODINGS_MAX = 3  # `%252e` is `%2e` after one decoding, `.` after two: a proxy may do both


def outside_base(raw_path: str) -> str | None:
    """Why `raw_path` (as the client encoded it) could leave provider.baseUrl's path, or None.

    A dot segment (`..`, `.`, `%2e%2e`, `%2E.`, `..;x`) is resolved by the provider or a proxy
    on the way as a step up; an encoded slash or backslash (`%2f`, `%5c`) is a separator to
    some of them. Each segment is percent-decoded until it stops changing (at most three
    times), so a doubly encoded one is caught too."""
    if "\\" in raw_path:
        return "a backslash"
    for segment in raw_path.split("/"):
        decoded = _decoded(segment)
        if decoded.split(";", 1)[0] in DOT_SEGMENTS:
            return f"the dot segment {segment[:40]!r}"
        if "/" in decoded or "\\" in decoded:
            return f"the encoded slash in {segment[:40]!r}"
    return None


def _decoded(segment: str) -> str:
    for _ in range(DECODINGS_MAX):
        if "%" not in segment:
            break
        segment = unquote(segment, errors="surrogateescape")
    return segment


def upstream_url(base_url: str, path: str, query: bytes) -> str:
    """{base}{path}?{the client's query}, keeping the base's own path."""
    parts = urlsplit(base_url)
    joined = parts.path.rstrip("/") + path
    return urlunsplit((parts.scheme, parts.netloc, joined, query.decode("latin-1"), ""))


def request_headers(
    client_headers: Iterable[tuple[bytes, bytes]], key: list[tuple[str, str]]
) -> list[tuple[str, str]]:
    """The client's headers to forward, as aiohttp takes them: str, which it writes as UTF-8.
    A value is decoded as UTF-8 so that its bytes go out as they came (bytes above 0x7F
    decoded as latin-1 went out re-encoded: `é` as two bytes, then four); the relay refused
    a value that is not UTF-8 beforehand (not_utf8_header)."""
    kept = [
        (name.decode("latin-1"), value.decode("utf-8"))
        for name, value in client_headers
        if name.lower() not in DROPPED_REQUEST_HEADERS
    ]
    return [*kept, ("accept-encoding", "identity"), *key]


def not_utf8_header(client_headers: Iterable[tuple[bytes, bytes]]) -> str | None:
    """The name of a forwarded header whose value is not UTF-8 (aiohttp can send no other
    bytes as they are), or None."""
    for name, value in client_headers:
        if value.isascii() or name.lower() in DROPPED_REQUEST_HEADERS:
            continue
        try:
            value.decode("utf-8")
        except UnicodeDecodeError:
            return name.decode("latin-1")
    return None


@dataclass(frozen=True)
class Aliased:
    body: bytes
    alias: str | None  # what the client asked for, when it named an alias
    model: str | None  # the model sent upstream


def resolve_alias(body: bytes, models: Mapping[str, str]) -> Aliased:
    """settings.json `models` keys in the JSON body's "model" become their model names. A body
    that is not a JSON object, or names no alias, goes out byte for byte as it came."""
    if not body.lstrip().startswith(b"{"):
        return Aliased(body, None, None)
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError:
        return Aliased(body, None, None)
    asked = parsed.get("model") if isinstance(parsed, dict) else None
    if not isinstance(asked, str):
        return Aliased(body, None, None)
    if asked not in models:
        return Aliased(body, None, asked)
    parsed["model"] = models[asked]
    return Aliased(orjson.dumps(parsed), asked, models[asked])


@dataclass
class Opened:
    response: aiohttp.ClientResponse
    attempts: int


@dataclass(frozen=True)
class Outgoing:
    method: str
    url: str
    headers: list[tuple[str, str]]
    body: bytes
    timeout_s: float
    max_retries: int
    proxy: str | None = None


async def open_upstream(
    client: aiohttp.ClientSession, out: Outgoing, rng: random.Random, backoff: Backoff = BACKOFF
) -> Opened:
    """The provider's response head (body still to read), retrying what may be retried."""
    attempts = 0
    while True:
        attempts += 1
        retries_left = attempts <= out.max_retries
        try:
            response = await _attempt(client, out)
        except UpstreamFailed as exc:
            exc.attempts = attempts
            raise
        except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError) as exc:
            if not retries_left:
                raise _unreachable(out.url, exc, attempts) from None
            await asyncio.sleep(backoff.delay_s(attempts, rng))
            continue
        if not retries_left or (response.status != 429 and response.status < 500):
            return Opened(response, attempts)
        wait_s = retry_after_s(response.headers.get("retry-after"))
        if wait_s is None:
            wait_s = backoff.delay_s(attempts, rng)
        if wait_s > RETRY_AFTER_MAX_S:
            return Opened(response, attempts)
        response.close()
        await asyncio.sleep(wait_s)


async def _attempt(client: aiohttp.ClientSession, out: Outgoing) -> aiohttp.ClientResponse:
    try:
        async with asyncio.timeout(out.timeout_s):
            return await http.send(
                client,
                out.method,
                URL(out.url, encoded=True),  # the path and query go as the client sent them
                headers=out.headers,
                body=out.body,
                timeout_s=out.timeout_s,
                proxy=out.proxy,
            )
    except (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError):
        raise
    except (TimeoutError, aiohttp.ServerTimeoutError):
        raise UpstreamFailed(
            504,
            "upstream_timeout",
            f"{_host(out.url)} sent no answer within {out.timeout_s:.3g} s",
            "raise provider.timeoutMs and api.request_timeout_s together, or check the provider",
            0,
        ) from None
    except aiohttp.ClientError as exc:
        raise UpstreamFailed(
            502,
            "upstream_failed",
            f"{_host(out.url)}: {type(exc).__name__}",
            "the provider closed the connection or answered something that is not HTTP",
            0,
        ) from None


def _unreachable(url: str, exc: Exception, attempts: int) -> UpstreamFailed:
    timed_out = isinstance(exc, aiohttp.ConnectionTimeoutError)
    what = "timed out connecting to" if timed_out else "cannot reach"
    return UpstreamFailed(
        502,
        "upstream_unreachable",
        f"the relay {what} {_host(url)} ({attempts} attempts)",
        "check provider.baseUrl and that the provider (or the proxy before it) is up: "
        "`taogpuctl api ping`",
        attempts,
    )


def _host(url: str) -> str:
    parts = urlsplit(url)
    return parts.netloc.rpartition("@")[2]
