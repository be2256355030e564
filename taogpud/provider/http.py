"""How the daemon talks HTTP to the AI provider: one client library, aiohttp, and its
settings, for the relay (relay/upstream.py, relay/websocket.py) and the channel's ping
(provider/channel.py) alike. What either sends is decided here once:

    session      new_session(): nothing of aiohttp's own added to a request (no User-Agent,
                 Accept, Accept-Encoding or Content-Type), nothing decompressed (the relay
                 passes answers on as they came), no cookie kept, a pool of 512 connections
    redirects    never followed (send()): a base URL that redirects is the operator's to fix
    TLS          aiohttp's verified default context: ssl.create_default_context(), made when
                 aiohttp is imported, so the system's CA store as OpenSSL finds it
                 (ca-certificates, which the packages recommend; SSL_CERT_FILE and
                 SSL_CERT_DIR honoured; no certifi); certificates and host names checked
    proxy        proxy_for(): http_proxy / https_proxy / all_proxy unless no_proxy exempts the
                 host, read once per configuration by the caller, passed with each request
    timeouts     attempt_timeout(): the connect, then every gap between two pieces of the
                 answer, within timeout_s (a long stream that flows is never cut); the caller
                 bounds the whole head with asyncio.timeout
    retries      Backoff (exponential, equal jitter) and retry_after_s (Retry-After read)
    the key      key_header(): the one place the key becomes a header; header_safe(): a key no
                 header can carry is not sent. Texts that may hold it go through
                 channel.Scrubber before anyone sees them.

Why aiohttp and not httpx (the simpler-looking choice, and the channel's until now): in one
run on the build host (bench/results/relay-upstream-ab.md) the relay on an httpx.AsyncClient
served 10% and 33% of aiohttp's requests/s with 8 clients and 21–80% when streaming at 1, 8
and 64 clients, and cost the daemon 3.9–5.0× the CPU per relayed request (1,110 and 1,361 µs
against 288 and 273 µs). The relay is the hot path; the channel follows it. aiohttp also
speaks WebSocket, which the relay's pass-through needs.
"""

from __future__ import annotations

import email.utils
import random
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
from pydantic import SecretStr
from yarl import URL

Family = Literal["openai", "anthropic"]
KeyHeader = Literal["auto", "authorization", "x-api-key"]
Headers = Sequence[tuple[str, str]] | Mapping[str, str]

MAX_CONNECTIONS = 512
KEEPALIVE_S = 30.0


def new_session() -> aiohttp.ClientSession:
    """The provider's client: one per user of it, made on the event loop that uses it.

    The proxy variables are read by proxy_for() once per configuration, not by aiohttp's
    trust_env, which reads ~/.netrc and the environment again at every request (in a
    thread: a third of the relay's CPU when measured)."""
    return aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(
            limit=MAX_CONNECTIONS, limit_per_host=0, keepalive_timeout=KEEPALIVE_S, ssl=True
        ),
        trust_env=False,
        auto_decompress=False,
        skip_auto_headers=("User-Agent", "Accept", "Accept-Encoding", "Content-Type"),
        cookie_jar=aiohttp.DummyCookieJar(),
        timeout=aiohttp.ClientTimeout(total=None),
    )


def attempt_timeout(timeout_s: float) -> aiohttp.ClientTimeout:
    """The connect, and each gap between two reads, within timeout_s; no cap on the whole."""
    return aiohttp.ClientTimeout(total=None, connect=timeout_s, sock_read=timeout_s)


async def send(
    session: aiohttp.ClientSession,
    method: str,
    url: str | URL,
    *,
    headers: Headers,
    body: bytes | None,
    timeout_s: float,
    proxy: str | None,
) -> aiohttp.ClientResponse:
    """One request, up to the response head (the body still to read; release it after)."""
    return await session.request(
        method,
        url,
        headers=headers,
        data=body or None,
        allow_redirects=False,
        timeout=attempt_timeout(timeout_s),
        proxy=proxy,
    )


def proxy_for(url: str) -> str | None:
    """The proxy that http_proxy / https_proxy / all_proxy name for `url`, unless no_proxy
    exempts its host (as httpx's and requests' trust_env read them)."""
    parts = urlsplit(url)
    if urllib.request.proxy_bypass(parts.hostname or ""):
        return None
    proxies = urllib.request.getproxies()
    return proxies.get(parts.scheme) or proxies.get("all")


@dataclass(frozen=True)
class Backoff:
    """Exponential backoff with "equal jitter": retry n waits U(c/2, c), c = min(cap, base·2ⁿ⁻¹)."""

    base_s: float = 0.5
    cap_s: float = 8.0

    def delay_s(self, retry: int, rng: random.Random) -> float:
        ceiling = min(self.cap_s, self.base_s * 2 ** (retry - 1))
        return rng.uniform(ceiling / 2, ceiling)


def retry_after_s(value: str | None) -> float | None:
    """Retry-After as seconds (a number, or an HTTP date); None when absent or unreadable."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


def key_header(key: SecretStr | None, mode: KeyHeader, family: Family) -> list[tuple[str, str]]:
    """The key as the provider expects it: anthropic-style requests in x-api-key (under
    "auto"), the rest as a Bearer token; no header without a key."""
    if key is None:
        return []
    if mode == "x-api-key" or (mode == "auto" and family == "anthropic"):
        return [("x-api-key", key.get_secret_value())]
    return [("authorization", f"Bearer {key.get_secret_value()}")]


def header_safe(key: str) -> bool:
    """Whether every character of the key is a visible ASCII one (a header can carry it)."""
    return all(0x21 <= ord(char) <= 0x7E for char in key)
