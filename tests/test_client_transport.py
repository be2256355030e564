"""The client's transport seam: the default one talks to the daemon's socket, a MockTransport
answers in this process, and the client reads both the same way.

The answers a mock gives here are the real daemon's, recorded through a transport that wraps
the default one: a test of the client through a mock is only worth what its answers are.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import pytest

from taogpud.client import ApiError, Client, DaemonUnreachable
from taogpud.client.http import UnixHTTPConnection
from taogpud.client.transport import (
    MalformedResponse,
    MockTransport,
    Request,
    RequestBody,
    Response,
    Transport,
)
from taogpud.testing import RunningDaemon, running


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    """One real daemon for the module: its answers are what the mocks replay."""
    with running() as started:
        yield started


class Exchange(NamedTuple):
    request: Request
    response: Response


class Recording:
    """A transport that passes each request to another and keeps what went and came back."""

    def __init__(self, inner: Transport) -> None:
        self.inner = inner
        self.exchanges: list[Exchange] = []

    def request(
        self, method: str, path: str, body: RequestBody, content_type: str, timeout_s: float
    ) -> tuple[int, bytes]:
        status, answer = self.inner.request(method, path, body, content_type, timeout_s)
        sent = Request.sent(method, path, body, content_type)
        self.exchanges.append(Exchange(sent, Response(status, answer)))
        return status, answer

    def close(self) -> None:
        self.inner.close()


def recorder(daemon: RunningDaemon) -> Recording:
    return Recording(UnixHTTPConnection(str(daemon.socket_path), 60.0))


def replay(exchanges: list[Exchange]) -> MockTransport:
    """A MockTransport that answers as the daemon did, in order, to the same requests."""
    left = list(exchanges)

    def handler(request: Request) -> Response:
        expected = left.pop(0)
        assert (request.method, request.path, request.body) == (
            expected.request.method,
            expected.request.path,
            expected.request.body,
        )
        return expected.response

    return MockTransport(handler)


# --- the default transport, unchanged --------------------------------------------------------


def test_the_default_client_talks_to_the_daemon_and_its_shm_socket(
    daemon: RunningDaemon,
) -> None:
    """Client(socket_path) opens its own Unix connection: a job runs, and compute hands its
    arrays over the `.shm` socket (the record names the client's memory)."""
    a = np.arange(1000, dtype=np.float32)
    with Client(daemon.socket_path) as client:
        assert isinstance(client.transport, UnixHTTPConnection)
        job = client.run("vector_add", {"size": 1000})
        out = client.compute("vector_add", a=a, b=a)
    assert (job["status"], job["backend"]) == ("succeeded", "cpu")
    np.testing.assert_array_equal(out["c"], a + a)
    assert out.job["memory"] is not None


# --- a MockTransport with the daemon's own answers -------------------------------------------


def test_submit_get_and_wait_through_a_mock_answer_as_the_daemon_did(
    daemon: RunningDaemon,
) -> None:
    """The records submit, get and wait return from the real daemon come back the same
    through a MockTransport replaying its answers; the handler sees the JSON body sent."""
    recording = recorder(daemon)
    with Client(transport=recording) as client:
        submitted = client.submit("sleep", {"ms": 300})
        got = client.get(submitted["id"])
        finished = client.wait(submitted["id"], timeout_s=30)
    assert finished["status"] == "succeeded"
    first = recording.exchanges[0].request
    assert (first.method, first.route) == ("POST", "/v1/jobs")
    assert first.json()["task"] == "sleep" and first.json()["params"] == {"ms": 300}
    with Client(transport=replay(recording.exchanges)) as mocked:
        assert mocked.submit("sleep", {"ms": 300}) == submitted
        assert mocked.get(submitted["id"]) == got
        assert mocked.wait(submitted["id"], timeout_s=30) == finished


def test_the_one_error_shape_through_a_mock_is_the_same_api_error(daemon: RunningDaemon) -> None:
    """The daemon's 404 for an unknown job, replayed, is ApiError with its code, message,
    hint and HTTP status, as it was from the socket."""
    recording = recorder(daemon)
    with Client(transport=recording) as client, pytest.raises(ApiError) as real:
        client.get("0000000000000000")
    with Client(transport=replay(recording.exchanges)) as mocked, pytest.raises(ApiError) as mock:
        mocked.get("0000000000000000")
    fields = ("code", "message", "hint", "http_status")
    assert [getattr(mock.value, name) for name in fields] == [
        getattr(real.value, name) for name in fields
    ]
    assert (mock.value.code, mock.value.http_status) == ("job_not_found", 404)
    assert mock.value.hint


def test_compute_through_another_transport_goes_over_http(daemon: RunningDaemon) -> None:
    """With a transport that is not its own socket, compute uploads, runs and downloads over
    HTTP (never the `.shm` socket beside socket_path); replayed, the same arrays come back."""
    a = np.arange(64, dtype=np.float32)
    b = np.full(64, 2.0, dtype=np.float32)
    recording = recorder(daemon)
    with Client(daemon.socket_path, transport=recording) as client:
        out = client.compute("vector_add", a=a, b=b)
    np.testing.assert_array_equal(out["c"], a + b)
    assert out.job["memory"] is None
    routes = [(x.request.method, x.request.route) for x in recording.exchanges]
    job_id = out.job["id"]
    assert routes == [
        ("POST", "/v1/arrays"),
        ("POST", "/v1/arrays"),
        ("POST", "/v1/jobs"),
        ("GET", f"/v1/jobs/{job_id}/outputs/c"),
    ]
    with Client(transport=replay(recording.exchanges)) as mocked:
        replayed = mocked.compute("vector_add", a=a, b=b)
    np.testing.assert_array_equal(replayed["c"], a + b)
    assert replayed.job == out.job


# --- failures a mock plays -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raised", "words"),
    [
        (ConnectionRefusedError(111, "Connection refused"), "nothing is listening on /x.sock"),
        (FileNotFoundError(2, "No such file or directory"), "no daemon socket at /x.sock"),
        (TimeoutError("timed out"), "did not answer within 60.1 s"),
        (ConnectionResetError(104, "reset"), "closed the connection"),
    ],
    ids=["refused", "missing", "silent", "hung-up"],
)
def test_a_handler_that_raises_as_a_socket_is_daemon_unreachable(
    raised: OSError, words: str
) -> None:
    """What a socket raises, raised by a handler, is DaemonUnreachable worded as for the real
    socket, naming the path the client was given."""

    def handler(request: Request) -> Response:
        raise raised

    client = Client("/x.sock", timeout_s=60, transport=MockTransport(handler))
    with client, pytest.raises(DaemonUnreachable) as caught:
        # a long-poll: the read may take 60 s + 0.1 s; a daemon away is retried for 0.1 s
        client.wait("0123abc", timeout_s=0.1)
    assert words in caught.value.message
    assert caught.value.socket_path == "/x.sock"


def test_a_refusing_mock_without_a_path_names_the_transport() -> None:
    """Without socket_path a client on a mock opens nothing and its errors name the
    transport, not a socket it never looked for."""

    def refuse(request: Request) -> Response:
        raise ConnectionRefusedError(111, "Connection refused")

    with Client(transport=MockTransport(refuse)) as client, pytest.raises(DaemonUnreachable) as e:
        client.health()
    assert e.value.message == "nothing is listening on <MockTransport>"


def test_malformed_answer_from_a_transport_is_a_bad_response() -> None:
    """A transport's MalformedResponse is ApiError bad_response, as from the socket."""

    def garbage(request: Request) -> Response:
        raise MalformedResponse("HttpParserError: invalid constant string")

    with Client(transport=MockTransport(garbage)) as client, pytest.raises(ApiError) as caught:
        client.status()
    assert caught.value.code == "bad_response"


def test_a_json_response_is_what_the_client_returns() -> None:
    """Response(json=...) is encoded as the daemon would send it (no job queued: []); the
    request's route and query are read back apart, and a GET has no body."""
    seen: list[Request] = []

    def handler(request: Request) -> Response:
        seen.append(request)
        return Response(200, json=[])

    with Client(transport=MockTransport(handler)) as client:
        assert client.list_jobs("queued", 5) == []
    assert (seen[0].route, seen[0].query) == ("/v1/jobs", {"limit": "5", "status": "queued"})
    assert (seen[0].body, seen[0].content_type) == (b"", "")
