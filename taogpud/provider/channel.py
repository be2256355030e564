"""The API channel: how the daemon reaches the AI provider, and the guide's ping.

The daemon holds the key; clients never need it. One ping is the setup guide's check:

    POST {base}/v1/chat/completions   Authorization: Bearer <key>
    {"model": models.<role>, "messages": [{"role": "user", "content": "ping"}], "max_tokens": 16}

and its answer is classified, never raised:

    status        retried  meaning
    ok                     a 2xx with a chat completion (choices[0].message)
    no_key                 401/403 and the daemon has no key (the sources tried are listed)
    rejected_key           401/403 with a key, or a key no HTTP header can carry (not sent)
    timeout         yes    no (whole) answer within the attempt's deadline
    dns             maybe  the base URL's host does not resolve (retried only if temporary)
    refused         yes    nothing listens at the base URL's host and port
    network         yes    another transport failure: reset, unreachable (TLS errors: no)
    bad_url                not an http(s) URL, a 3xx, or a 404/405 that is not the API's
    utm_params             the base URL carries utm_* parameters: nothing is sent
    bad_answer             a 2xx whose body is not the expected JSON
    http_error      429/5xx  any other HTTP status (429 honours Retry-After)

Timeouts: each attempt has a whole-request deadline (asyncio.timeout; the client's own are per
connect and read) of min(provider.timeoutMs, api.request_timeout_s); a caller may cap the whole
ping too. Retries: provider.maxRetries more attempts, with exponential backoff and jitter, for
the statuses marked above. The client, its proxy, TLS and the key's header are the relay's
too (taogpud/provider/http.py: aiohttp, and why).

The key is never in a result, a log line, a repr or an error text: everything that came from
outside (server bodies, exception texts) goes through `Scrubber` before it is shown.
"""

from __future__ import annotations

import asyncio
import base64
import json
import math
import os
import random
import re
import socket
import ssl
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

import aiohttp
from pydantic import BaseModel, SecretStr
from pydantic_core import PydanticCustomError

from taogpud import __version__
from taogpud.config import (
    ConfigSnapshot,
    KeySource,
    check_api_url,  # the one place the URL rule lives
)
from taogpud.config.rules import CREDENTIAL_NAME, REDACTED
from taogpud.observability.logging import get_logger
from taogpud.provider import http
from taogpud.provider.http import Backoff

log = get_logger("taogpud.channel")

ModelRole = Literal["default", "coding", "reasoning"]
PingStatus = Literal[
    "ok",
    "no_key",
    "rejected_key",
    "timeout",
    "dns",
    "refused",
    "network",
    "bad_url",
    "utm_params",
    "bad_answer",
    "http_error",
]

CHAT_PATH = "/v1/chat/completions"
PING_BODY_MAX_TOKENS = 16
MAX_ANSWER_BYTES = 1 << 20  # a chat completion for 16 tokens is a few hundred bytes
RETRY_AFTER_MAX_S = 60.0  # a server asking for a longer wait ends the ping instead
SNIPPET_CHARS = 200


class PingResult(BaseModel):
    """What one ping found; the API's answer to POST /v1/channel/ping."""

    ok: bool
    status: PingStatus
    detail: str
    hint: str = ""
    role: ModelRole
    model: str  # the model asked for (models.<role>)
    answered_model: str | None = None  # the "model" the answer names
    latency_ms: float | None = None  # the answering attempt's round trip
    elapsed_ms: float  # every attempt and wait together
    attempts: int  # requests sent (0: refused before sending)
    http_status: int | None = None
    url: str  # the endpoint, without credentials or query
    key_source: KeySource


@dataclass(frozen=True)
class ChannelSettings:
    """The channel as config resolves it (DESIGN §1). The key is a SecretStr: reprs hide it."""

    base_url: str
    api_key: SecretStr | None
    key_source: KeySource
    timeout_s: float
    max_retries: int
    models: Mapping[str, str]
    key_sources_tried: tuple[str, ...] = ()  # what was looked at, for a no_key answer
    key_advice: str = ""  # how to give the daemon its key, the way it was started (key_advice)

    @classmethod
    def from_snapshot(
        cls, snapshot: ConfigSnapshot, environ: Mapping[str, str] | None = None
    ) -> ChannelSettings:
        settings, api = snapshot.settings, snapshot.config.api
        return cls(
            base_url=settings.provider.base_url,
            api_key=snapshot.api_key,
            key_source=snapshot.key_source,
            timeout_s=min(settings.provider.timeout_ms / 1000, api.request_timeout_s),
            max_retries=settings.provider.max_retries,
            models=settings.models.model_dump(),
            key_sources_tried=key_sources_tried(
                snapshot, os.environ if environ is None else environ
            ),
            key_advice=key_advice(os.environ if environ is None else environ, api.api_key_env),
        )

    def no_key(self) -> tuple[str, str]:
        """(message, hint) of a daemon that holds no key: it sends nothing without one."""
        tried = "; ".join(self.key_sources_tried) or "no source configured"
        hint = self.key_advice or key_advice(os.environ, "TAOTOKEN_API_KEY")
        return f"the daemon has no API key, so nothing was sent. Tried: {tried}", hint


_KEYLESS_SERVER = (
    'a local server that needs no key (vLLM, Ollama): set provider.apiKey to any text, e.g. "none"'
)


def key_advice(environ: Mapping[str, str], env_name: str) -> str:
    """How to give the daemon its key, for the way it was started: systemd sets INVOCATION_ID
    in every service's environment (and CREDENTIALS_DIRECTORY with LoadCredential=); a
    daemon started in a terminal reads the shell's environment."""
    if environ.get("INVOCATION_ID") or environ.get("CREDENTIALS_DIRECTORY"):
        return (
            f"give the service the key: LoadCredential={CREDENTIAL_NAME}:PATH in its unit "
            f"(or Environment=/EnvironmentFile= with {env_name}), then restart it; your shell "
            f"and taogpuctl never need it. For {_KEYLESS_SERVER}"
        )
    return (
        f"export {env_name}=YOUR_KEY in the shell that starts taogpud, then restart taogpud. "
        f"For {_KEYLESS_SERVER}"
    )


def key_sources_tried(snapshot: ConfigSnapshot, environ: Mapping[str, str]) -> tuple[str, ...]:
    """Where the key was looked for, in order, each with why it gave nothing; no values."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if directory:
        path = Path(directory) / CREDENTIAL_NAME
        credential = f"the systemd credential {path} (missing or empty)"
    else:
        credential = (
            f"the systemd credential {CREDENTIAL_NAME} "
            "($CREDENTIALS_DIRECTORY is not set: the unit has no LoadCredential=)"
        )
    name = snapshot.show(snapshot.config.api.api_key_env)  # the key itself, typed there?
    env_state = "set but empty" if name in environ else "not set"
    where = str(snapshot.settings_path) if snapshot.settings_path else "the embedded defaults"
    return (
        credential,
        f"the env var {name} ({env_state} in the daemon's environment)",
        f"provider.apiKey in {where} (empty after ${{VAR}} expansion)",
    )


class Scrubber:
    """Replaces the key in any text: raw, as reprs and byte reprs escape it, base64-encoded
    (alone or inside a longer base64 text, such as Basic auth), and masked as providers
    echo it back ("sk-ab****wxyz": some first and last characters around asterisks)."""

    def __init__(self, secret: SecretStr | None) -> None:
        value = secret.get_secret_value() if secret is not None else ""
        forms = {value, repr(value)[1:-1], repr(value.encode("utf-8", "replace"))[2:-1]}
        forms |= _base64_forms(value.encode("utf-8", "replace")) if value else set()
        self._forms = sorted((form for form in forms if len(form) >= 4), key=len, reverse=True)
        self._key = value

    @property
    def forms(self) -> tuple[str, ...]:
        """Every text the key is replaced in, longest first (the relay scrubs them as bytes)."""
        return tuple(self._forms)

    def __call__(self, text: str) -> str:
        for form in self._forms:
            text = text.replace(form, REDACTED)
        return _MASKED.sub(self._unmask, text) if len(self._key) >= 8 else text

    def _unmask(self, found: re.Match[str]) -> str:
        """A masked token is the key's when what shows of it is the key's own start and end."""
        start, end = found.group(1), found.group(3).rstrip(".,;:")
        shown = len(start) + len(end)
        key = self._key
        if shown and shown < len(key) and key.startswith(start) and key.endswith(end):
            return REDACTED + found.group(3)[len(end) :]  # a sentence's full stop stays
        return found.group(0)


# A token with a run of mask characters inside: what shows before it, the run, what after.
_MASKED = re.compile(r"([\w\-.~+/]*?)(\*{3,}|•{3,}|\.{3}|…)([\w\-.~+/]*)")


def _base64_forms(raw: bytes) -> set[str]:
    """The base64 text of `raw` at each of the three alignments it can have inside longer
    data (only the characters that depend on `raw` alone), standard and URL-safe."""
    forms = set()
    for offset in range(3):
        encoded = base64.b64encode(bytes(offset) + raw).decode("ascii")
        first, last = -(-offset // 3), (offset + len(raw)) // 3  # whole 3-byte groups of raw
        core = encoded[4 * first : 4 * last]
        if len(core) >= 8:
            forms |= {core, core.replace("+", "-").replace("/", "_")}
    return forms


def url_problem(base_url: str) -> tuple[PingStatus, str, str] | None:
    """(status, detail, hint) when the base URL must not be used; the config's own rule."""
    try:
        check_api_url(base_url)
    except PydanticCustomError as exc:
        status: PingStatus = "utm_params" if exc.type == "utm_params" else "bad_url"
        fix = str((exc.context or {}).get("fix", ""))
        where = "provider.baseUrl (settings.json) and api.base_url (config.toml)"
        return status, f"the base URL {public_url(base_url)} {exc.message()}", f"{fix} in {where}"
    return None


def public_url(url: str) -> str:
    """The URL without user info, query or fragment: safe to show and log."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = f":{parts.port}" if parts.port else ""
    except ValueError:
        return "<unparseable URL>"
    if ":" in host:
        host = f"[{host}]"
    return urlunsplit((parts.scheme, host + port, parts.path, "", ""))


def endpoint(base_url: str) -> str:
    """{base}/v1/chat/completions, keeping the base's path and query as they are."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/") + CHAT_PATH
    return urlunsplit((parts.scheme, parts.netloc, path, parts.query, ""))


@dataclass
class _Attempt:
    """One request's outcome, before the retry loop decides what to do with it."""

    status: PingStatus
    detail: str
    hint: str = ""
    retry: bool = False
    retry_after_s: float | None = None
    http_status: int | None = None
    latency_ms: float | None = None
    answered_model: str | None = None


class Channel:
    """The API channel. Use as `async with Channel(settings) as channel:` (on the loop)."""

    def __init__(
        self,
        settings: ChannelSettings,
        *,
        backoff: Backoff | None = None,
        trust_env: bool = True,  # HTTPS_PROXY / NO_PROXY, as operators expect
        rng: random.Random | None = None,
    ) -> None:
        self.settings = settings
        self.backoff = backoff or Backoff()
        self._rng = rng or random.Random()
        self._scrub = Scrubber(settings.api_key)
        self._proxy = http.proxy_for(settings.base_url) if trust_env else None
        self._client = http.new_session()

    def __repr__(self) -> str:
        return (
            f"Channel(base_url={public_url(self.settings.base_url)!r}, "
            f"key_source={self.settings.key_source!r})"
        )

    async def __aenter__(self) -> Channel:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._client.close()

    async def ping(
        self, role: ModelRole = "default", *, deadline_s: float | None = None
    ) -> PingResult:
        """The guide's check, classified. `deadline_s` caps the whole ping, retries included."""
        started = time.monotonic()
        model = self.settings.models[role]
        url = endpoint(self.settings.base_url)
        refused = self._refuse_early()
        if refused is not None:
            return self._result(role, model, refused, attempts=0, started=started)
        deadline = math.inf if deadline_s is None else started + deadline_s
        body = {
            "model": model,
            "messages": [{"role": "user", "content": "ping"}],
            "max_tokens": PING_BODY_MAX_TOKENS,
        }
        attempts, outcome = 0, _Attempt("timeout", "no attempt fitted the deadline")
        while True:
            budget_s = min(self.settings.timeout_s, deadline - time.monotonic())
            if budget_s <= 0:
                break
            attempts += 1
            outcome = await self._attempt(url, body, budget_s)
            wait_s = self._next_wait_s(outcome, attempts, deadline)
            if wait_s is None:
                break
            log.info(
                "channel.retry",
                attempt=attempts,
                status=outcome.status,
                http_status=outcome.http_status,
                wait_s=round(wait_s, 3),
            )
            await asyncio.sleep(wait_s)
        return self._result(role, model, outcome, attempts=attempts, started=started)

    # -- one attempt -----------------------------------------------------------------------

    def _refuse_early(self) -> _Attempt | None:
        problem = url_problem(self.settings.base_url)
        if problem is not None:
            return _Attempt(*problem)
        key = self.settings.api_key
        if key is None:
            return _Attempt("no_key", *self.settings.no_key())
        if not http.header_safe(key.get_secret_value()):
            return _Attempt(
                "rejected_key",
                f"the key from {self.settings.key_source} holds a character an HTTP header "
                "cannot carry (a space, a newline or a non-ASCII character); it was not sent",
                "rewrite the key without it: a stray newline or space from the file it came "
                "from is the usual cause",
            )
        return None

    def _headers(self) -> list[tuple[str, str]]:
        """What the guide's request carries: the key as a Bearer token, JSON both ways."""
        return [
            ("User-Agent", f"taogpud/{__version__}"),
            ("Accept", "application/json"),
            ("Accept-Encoding", "identity"),  # the client decompresses nothing
            ("Content-Type", "application/json"),
            *http.key_header(self.settings.api_key, "authorization", "openai"),
        ]

    async def _attempt(self, url: str, body: dict[str, Any], budget_s: float) -> _Attempt:
        sent = time.perf_counter()
        payload = json.dumps(body).encode()
        try:
            async with asyncio.timeout(budget_s):
                response = await http.send(
                    self._client,
                    "POST",
                    url,
                    headers=self._headers(),
                    body=payload,
                    timeout_s=budget_s,
                    proxy=self._proxy,
                )
                try:
                    raw = await _read_capped(response)
                finally:
                    response.release()
        except TimeoutError as exc:  # aiohttp's connect and read timeouts are TimeoutErrors
            return self._timed_out(exc, url, budget_s)
        except aiohttp.ClientError as exc:
            return self._transport_failure(exc, url)
        except (UnicodeError, ValueError) as exc:  # e.g. an unencodable header
            detail = (
                f"the request could not be built ({type(exc).__name__}: {self._scrub(str(exc))})"
            )
            return _Attempt("http_error", detail, "this is a bug in taogpud or a broken key")
        latency_ms = (time.perf_counter() - sent) * 1000
        outcome = self._classify(response, raw)
        outcome.latency_ms = round(latency_ms, 3)
        return outcome

    def _timed_out(self, exc: Exception, url: str, budget_s: float) -> _Attempt:
        if isinstance(exc, aiohttp.ConnectionTimeoutError):
            detail = f"connecting to {_host(url)} took longer than {budget_s:.3g} s"
        else:
            detail = f"no answer from {_host(url)} within {budget_s:.3g} s"
        return _Attempt(
            "timeout",
            detail,
            "check the network path to the host (proxy, firewall), or raise provider.timeoutMs "
            "and api.request_timeout_s together",
            retry=True,
        )

    def _transport_failure(self, exc: aiohttp.ClientError, url: str) -> _Attempt:
        said = self._scrub(str(exc)) or type(exc).__name__
        host = _host(url)
        connect = self._connect_failure(exc, url, said)
        if connect is not None:
            return connect
        if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
            return _Attempt("bad_url", f"{public_url(url)} cannot be used ({said})", _URL_FIX)
        if isinstance(exc, _NO_PROPER_ANSWER) and not isinstance(exc, aiohttp.ClientHttpProxyError):
            detail = f"{host} closed the connection without a proper answer ({said})"
            return _Attempt("network", detail, _NETWORK_FIX, retry=True)
        if isinstance(exc, aiohttp.ClientConnectionError | aiohttp.ClientHttpProxyError):
            detail = f"{host}: {type(exc).__name__}: {said}"
            return _Attempt("network", detail, _NETWORK_FIX, retry=True)
        return _Attempt("http_error", f"{host}: {type(exc).__name__}: {said}", _NETWORK_FIX)

    def _connect_failure(self, exc: aiohttp.ClientError, url: str, said: str) -> _Attempt | None:
        """DNS, a refused connection or TLS, found anywhere in the exception's chain."""
        gai = _cause(exc, socket.gaierror)
        if gai is not None:
            return _Attempt(
                "dns",
                f"{_hostname(url)} does not resolve ({self._scrub(str(gai))})",
                "check the host name in provider.baseUrl / api.base_url and this host's DNS "
                f"(`getent hosts {_hostname(url)}`)",
                retry=gai.errno == socket.EAI_AGAIN,  # "temporary failure in name resolution"
            )
        if _cause(exc, ConnectionRefusedError) is not None:
            return _Attempt(
                "refused",
                f"{_host(url)} refused the connection: nothing listens there",
                "check the port in the base URL, and that the provider (or the proxy in front "
                "of it) is up",
                retry=True,
            )
        if _cause(exc, ssl.SSLError) is not None:  # a certificate does not get better by retrying
            hint = "check the host's certificate and this host's CA bundle (SSL_CERT_FILE)"
            return _Attempt("network", f"TLS with {_host(url)} failed ({said})", hint)
        return None

    # -- the answer ------------------------------------------------------------------------

    def _classify(self, response: aiohttp.ClientResponse, raw: bytes) -> _Attempt:
        status = response.status
        if 200 <= status < 300:
            return self._answer(status, raw)
        said = self._server_said(raw)
        if status in (401, 403):
            return self._key_refused(status, said)
        if 300 <= status < 400:
            location = public_url(response.headers.get("location", "")) or "nowhere"
            detail = f"HTTP {status}: the base URL redirects to {location}"
            return _Attempt(
                "bad_url", detail, "use the final URL as the base URL", http_status=status
            )
        if status in (404, 405) and not _is_api_error(raw):
            return self._not_the_api(status, said)
        if status == 429:
            retry_after = http.retry_after_s(response.headers.get("retry-after"))
            detail = f"HTTP 429: rate limited{_suffix(said)}"
            hint = "wait and ping again; check the plan's rate limits with the provider"
            return _Attempt("http_error", detail, hint, True, retry_after, status)
        hint = (
            "the provider is failing right now; ping again later"
            if status >= 500
            else "check the model names in settings.json models.* and the provider's docs"
        )
        detail = f"HTTP {status}{_suffix(said)}"
        return _Attempt("http_error", detail, hint, retry=status >= 500, http_status=status)

    def _answer(self, status: int, raw: bytes) -> _Attempt:
        try:
            document = json.loads(raw)
        except ValueError:
            return self._bad_answer(status, f"a body that is not JSON: {self._snippet(raw)}")
        choices = document.get("choices") if isinstance(document, dict) else None
        message = choices[0].get("message") if choices and isinstance(choices[0], dict) else None
        if not isinstance(message, dict):
            return self._bad_answer(
                status, f"JSON without choices[0].message: {self._snippet(raw)}"
            )
        answered = document.get("model")
        content = message.get("content")
        said = f": {self._scrub(str(content))[:40]!r}" if content else ""
        return _Attempt(
            "ok",
            f"answered{said}",
            http_status=status,
            answered_model=self._scrub(answered)[:SNIPPET_CHARS]
            if isinstance(answered, str)
            else None,
        )

    def _bad_answer(self, status: int, what: str) -> _Attempt:
        return _Attempt(
            "bad_answer",
            f"HTTP {status} with {what}",
            "the base URL must be the API's (the guide's https://taotoken.net/api), not a web "
            "page or a proxy's; taogpud adds /v1/chat/completions itself",
            http_status=status,
        )

    def _key_refused(self, status: int, said: str) -> _Attempt:
        return _Attempt(
            "rejected_key",
            f"HTTP {status}: the provider refused the key from {self.settings.key_source}"
            f"{_suffix(said)}",
            "check that the key is current and meant for this base URL; replace it where "
            f"it comes from ({self.settings.key_source})",
            http_status=status,
        )

    def _not_the_api(self, status: int, said: str) -> _Attempt:
        path = urlsplit(self.settings.base_url).path.rstrip("/")
        hint = _URL_FIX
        if path.endswith("/v1"):
            hint = "the base URL ends in /v1 and taogpud adds /v1/chat/completions: drop the /v1"
        detail = f"HTTP {status} from {public_url(endpoint(self.settings.base_url))}{_suffix(said)}"
        return _Attempt("bad_url", detail, hint, http_status=status)

    def _server_said(self, raw: bytes) -> str:
        """The server's error message (OpenAI shape {"error": {"message"}}) or a snippet."""
        try:
            document = json.loads(raw)
        except ValueError:
            return self._snippet(raw)
        error = document.get("error") if isinstance(document, dict) else None
        if isinstance(error, dict) and isinstance(error.get("message"), str):
            return self._scrub(error["message"])[:SNIPPET_CHARS]
        if isinstance(error, str):
            return self._scrub(error)[:SNIPPET_CHARS]
        return self._snippet(raw)

    def _snippet(self, raw: bytes) -> str:
        text = " ".join(raw.decode("utf-8", "replace").split())
        text = self._scrub(text)
        return text if len(text) <= SNIPPET_CHARS else text[:SNIPPET_CHARS] + "…"

    # -- retries and the result ------------------------------------------------------------

    def _next_wait_s(self, outcome: _Attempt, attempts: int, deadline: float) -> float | None:
        """How long to wait before the next attempt; None: stop here."""
        if not outcome.retry or attempts > self.settings.max_retries:
            return None
        wait_s = outcome.retry_after_s
        if wait_s is None:
            wait_s = self.backoff.delay_s(attempts, self._rng)
        elif wait_s > RETRY_AFTER_MAX_S:
            outcome.detail += f"; the server asks to retry after {wait_s:g} s"
            return None
        if time.monotonic() + wait_s >= deadline:
            return None
        return wait_s

    def _result(
        self, role: ModelRole, model: str, outcome: _Attempt, *, attempts: int, started: float
    ) -> PingResult:
        elapsed_ms = round((time.monotonic() - started) * 1000, 3)
        tries = f" after {attempts} attempts" if attempts > 1 and outcome.status != "ok" else ""
        result = PingResult(
            ok=outcome.status == "ok",
            status=outcome.status,
            detail=self._scrub(outcome.detail + tries),
            hint=self._scrub(outcome.hint),
            role=role,
            model=model,
            answered_model=outcome.answered_model,
            latency_ms=outcome.latency_ms,
            elapsed_ms=elapsed_ms,
            attempts=attempts,
            http_status=outcome.http_status,
            url=public_url(endpoint(self.settings.base_url)),
            key_source=self.settings.key_source,
        )
        log_method = log.info if result.ok else log.warning
        log_method(
            "channel.ping",
            status=result.status,
            role=role,
            model=model,
            attempts=attempts,
            latency_ms=result.latency_ms,
            http_status=result.http_status,
            url=result.url,
            key_source=result.key_source,
        )
        return result


async def ping(
    settings: ChannelSettings, role: ModelRole = "default", *, deadline_s: float | None = None
) -> PingResult:
    """One ping on a channel of its own (the daemon pings rarely: no client is kept)."""
    async with Channel(settings) as channel:
        return await channel.ping(role, deadline_s=deadline_s)


_URL_FIX = (
    "check provider.baseUrl (settings.json) and api.base_url (config.toml): the guide's is "
    "https://taotoken.net/api"
)
_NETWORK_FIX = "check the network path to the provider (proxy, firewall, VPN) and ping again"
# a hang-up before the answer, one cut short, or bytes that are not HTTP (aiohttp's parser
# raises ClientResponseError; a proxy refusing CONNECT, a subclass, is the network's)
_NO_PROPER_ANSWER = (
    aiohttp.ServerDisconnectedError,
    aiohttp.ClientPayloadError,
    aiohttp.ClientResponseError,
)


async def _read_capped(response: aiohttp.ClientResponse) -> bytes:
    chunks, size = [], 0
    async for chunk in response.content.iter_any():
        chunks.append(chunk)
        size += len(chunk)
        if size >= MAX_ANSWER_BYTES:
            break
    return b"".join(chunks)


def _cause(exc: BaseException, kind: type[BaseException]) -> Any:
    """The first exception of `kind` in exc's cause/context chain, or None."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        if isinstance(current, kind):
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def _is_api_error(raw: bytes) -> bool:
    """Whether a body is an API's error object ({"error": ...}), not a web server's page."""
    try:
        document = json.loads(raw)
    except ValueError:
        return False
    return isinstance(document, dict) and "error" in document


def _host(url: str) -> str:
    parts = urlsplit(url)
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:  # a port out of range
        return _hostname(url)
    return f"{_hostname(url)}:{port}"


def _hostname(url: str) -> str:
    try:
        return urlsplit(url).hostname or "?"
    except ValueError:
        return "?"


def _suffix(said: str) -> str:
    return f" ({said})" if said else ""
