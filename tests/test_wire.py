"""taogpud.wire, what daemon and client both speak (issue 18.2): one module, no server framework.

The client reads the wire without pydantic, FastAPI or Starlette; every route the client calls
is one the wire names, and every route the wire names is one the daemon serves (its OpenAPI
document, from the app's own routes); the API's bounds are the wire's limits.
"""

from __future__ import annotations

import http.client
import http.server
import re
import socket
import subprocess
import sys
from typing import Any

import orjson
import pytest

from taogpud import wire
from taogpud.client import ApiError, Client
from taogpud.client.transport import MockTransport, Request, Response
from taogpud.testing import DaemonHandle, InProcessDaemon

SERVER_FRAMEWORKS = ("pydantic", "pydantic_core", "fastapi", "starlette")
CLIENT_MODULES = (
    "taogpud.client",
    "taogpud.client.http",
    "taogpud.client.transport",
    "taogpud.client.stream",
)

CLOSURE_PROBE = """
import importlib, sys
for name in sys.argv[1:]:
    importlib.import_module(name)
print(" ".join(sorted(sys.modules)))
"""


def imported_by(*modules: str) -> set[str]:
    """Every module a fresh interpreter holds after importing `modules`."""
    done = subprocess.run(
        [sys.executable, "-c", CLOSURE_PROBE, *modules],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    return set(done.stdout.split())


def test_the_client_reads_the_wire_without_any_server_framework() -> None:
    """The client imports taogpud.wire (no mirrored states or routes) and, through it,
    neither pydantic nor FastAPI nor Starlette."""
    closure = imported_by(*CLIENT_MODULES)
    assert "taogpud.wire" in closure
    assert {name.split(".")[0] for name in closure} & set(SERVER_FRAMEWORKS) == set()
    assert not {name for name in closure if name.startswith("taogpud.api")}


def test_the_wire_is_standard_library_only() -> None:
    """Importing taogpud.wire brings in no third-party package and no other taogpud module."""
    closure = imported_by("taogpud.wire")
    ours = {name for name in closure if name.startswith("taogpud")}
    assert ours == {"taogpud", "taogpud.wire"}
    assert {name.split(".")[0] for name in closure} & set(SERVER_FRAMEWORKS) == set()


# --- routes: what the client calls, what the daemon serves -------------------------------------


def recording_client(requests: list[tuple[str, str]]) -> Client:
    """A client whose requests are kept as (method, path as sent), each answered what the
    client expects of its route, in this process (a MockTransport)."""

    def handler(request: Request) -> Response:
        requests.append((request.method, request.path))
        listing = request.route in (wire.DEVICES.path, wire.TASKS.path) or (
            request.method == "GET" and request.route == wire.LIST_JOBS.path
        )
        job = {"id": "0123abc", "status": "succeeded", "outputs": []}
        if request.method == "GET" and request.route.endswith("/log"):  # a program's log
            return Response(200, json={"data_b64": "", "next": 0, "ended": True})
        return Response(200, json=[] if listing else job)

    return Client(transport=MockTransport(handler))


def call_every_method(client: Client) -> None:
    """Each public call of the client once (compute goes through upload, submit, download)."""
    job_id, odd = "0123abc", "a/../b?c"  # an id that would reach another route unquoted
    for call in (client.health, client.info, client.status, client.devices, client.tasks):
        call()
    client.config(), client.reload_config(), client.config_status()
    client.channel_ping("coding", timeout_s=1.0), client.doctor(ping=False, timeout_s=1.0)
    client.relay_token(), client.relay_revoke(), client.relay_revoke(7), client.relay_status()
    client.relay_models(), client.mcp_call("job", ok=False, job_id=odd, error_code="x")
    client.submit("noop"), client.submit("noop", wait_s=0.5), client.run("noop")
    client.get(odd), client.list_jobs("queued", 5), client.cancel(job_id)
    client.wait(job_id, timeout_s=1.0), client.upload_array(b"\x93NUMPY")
    client.download_output(odd, odd)
    client.submit_program(["true"]), client.lease(odd, after="queued", wait_s=0.5)
    client.program_started(odd, 1234), client.program_exited(odd, exit_code=0)
    client.append_program_log(odd, b"out"), client.program_log(odd, 0, wait_s=0.5)


def route_of(method: str, target: str) -> wire.Route | None:
    """The wire route a request line matches ({name} is one quoted path segment)."""
    path = target.partition("?")[0]
    for route in (*wire.ROUTES, wire.RELAY_MODELS):
        pattern = re.sub(r"\\\{\w+\\\}", "[^/]+", re.escape(route.path))
        if route.method == method and re.fullmatch(pattern, path):
            return route
    return None


def test_every_request_the_client_sends_is_a_wire_route() -> None:
    """Recorded at the client's transport: each call's method and path (as it goes on the
    request line) is one the wire names, ids and names quoted into one segment."""
    requests: list[tuple[str, str]] = []
    with recording_client(requests) as client:
        call_every_method(client)
    unmatched = [line for line in requests if route_of(*line) is None]
    assert len(requests) == 31 and unmatched == []  # one per call above
    assert ("GET", "/v1/jobs/a%2F..%2Fb%3Fc") in requests
    used = {route_of(*line) for line in requests}
    assert used >= set(wire.ROUTES) - {wire.METRICS, wire.OPENAPI, wire.TRACE, wire.JOB_EVENTS}


def openapi_routes(daemon: DaemonHandle) -> set[wire.Route]:
    """(method, path) of every operation the daemon's OpenAPI document lists."""
    conn = http.client.HTTPConnection("localhost")
    conn.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.sock.connect(str(daemon.socket_path))
    conn.request(wire.OPENAPI.method, wire.OPENAPI.path)
    document = orjson.loads(conn.getresponse().read())
    conn.close()
    return {
        wire.Route(method.upper(), path)
        for path, operations in document["paths"].items()
        for method in operations
    }


def test_the_daemon_serves_exactly_the_wire_routes(inprocess_daemon: InProcessDaemon) -> None:
    """The app's routes (its OpenAPI document) are the wire's, no more and no fewer; the
    relay answers under its prefix, in front of the app."""
    assert openapi_routes(inprocess_daemon) == set(wire.ROUTES) - {wire.OPENAPI}
    with Client(inprocess_daemon.socket_path) as client:
        assert client.health()["ok"] is True  # the document itself came from wire.OPENAPI
        status, body = client.relay_models()
    assert status != 404 or b'"not_found"' not in body  # the relay's answer, not the app's


# --- limits: the API's bounds are the wire's ---------------------------------------------------


def submit_error(client: Client, **fields: Any) -> ApiError:
    with pytest.raises(ApiError) as caught:
        client.submit("noop", **fields)
    return caught.value


def test_the_api_bounds_a_job_by_the_wire_limits(inprocess_daemon: InProcessDaemon) -> None:
    """A priority, retry count or affinity one past the wire's limit is refused with a 422
    that names the limit; one at the limit is taken."""
    with Client(inprocess_daemon.socket_path) as client:
        high = submit_error(client, priority=wire.PRIORITY_MAX + 1)
        low = submit_error(client, priority=wire.PRIORITY_MIN - 1)
        retries = submit_error(client, max_retries=wire.MAX_RETRIES + 1)
        affinity = submit_error(client, affinity="k" * (wire.MAX_AFFINITY_CHARS + 1))
        taken = client.submit("noop", priority=wire.PRIORITY_MAX, max_retries=wire.MAX_RETRIES)
    assert {high.http_status, low.http_status, retries.http_status} == {422}
    assert f"less than or equal to {wire.PRIORITY_MAX}" in high.message
    assert f"greater than or equal to {wire.PRIORITY_MIN}" in low.message
    assert f"less than or equal to {wire.MAX_RETRIES}" in retries.message
    assert f"at most {wire.MAX_AFFINITY_CHARS} characters" in affinity.message
    assert taken["priority"] == wire.PRIORITY_MAX and taken["max_retries"] == wire.MAX_RETRIES


# --- the shapes themselves ----------------------------------------------------------------------


def test_a_route_quotes_each_segment_and_appends_its_query() -> None:
    """An id with a slash cannot reach another route; the query is form-encoded."""
    url = wire.JOB_OUTPUT.url({"a": "1 2"}, job_id="x/../y", name="out")
    assert url == "/v1/jobs/x%2F..%2Fy/outputs/out?a=1+2"
    assert wire.STATUS.url() == "/v1/status"


def test_an_error_body_is_read_back_also_when_a_framework_wrapped_it() -> None:
    """{code, message, hint} as it is or under "detail"; anything else is no error body."""
    body = wire.ErrorBody("queue_full", "the queue is full", "retry later")
    assert wire.ErrorBody.from_json(body.as_dict()) == body
    assert wire.ErrorBody.from_json({"detail": body.as_dict()}) == body
    assert wire.ErrorBody.from_json({"code": "x"}) == wire.ErrorBody("x", "", "")
    for other in ({"detail": [{"loc": ["body"]}]}, [], "text", {"code": 3}):
        assert wire.ErrorBody.from_json(other) is None


def test_the_finished_states_are_the_final_ones() -> None:
    assert {"succeeded", "failed", "cancelled", "timed_out", "interrupted"} == wire.FINISHED_STATES
    assert not wire.JobState.queued.finished and not wire.JobState.running.finished


# --- typed views: the client's answers as TypedDicts, key for key the API's models -------------


def keys_of(view: Any) -> set[str]:
    return set(view.__required_keys__ | view.__optional_keys__)


def test_each_typed_view_has_the_keys_of_the_api_model_it_mirrors() -> None:
    """A field added to (or dropped from) an answer's model and not to its typed view fails
    here, so mypy's checks of the CLI's keys stay true to the wire."""
    from taogpud.api import models
    from taogpud.jobs import records
    from taogpud.provider.channel import PingResult

    pairs = [
        (wire.JobJson, records.JobRecord), (wire.JobErrorJson, records.JobErrorView),
        (wire.OutputJson, records.OutputView), (wire.PeerJson, records.Peer),
        (wire.StatusJson, models.StatusView), (wire.WorkerJson, models.WorkerView),
        (wire.ArraysJson, models.ArraysView), (wire.DoorJson, models.DoorView),
        (wire.ArrayJson, models.ArrayView), (wire.HealthJson, models.HealthView),
        (wire.LeaseJson, models.LeaseView), (wire.ReloadJson, models.ReloadModel),
        (wire.ChangeJson, models.ChangeModel), (wire.ConfigStatusJson, models.ConfigStatusView),
        (wire.CheckJson, models.CheckView), (wire.DoctorJson, models.DoctorView),
        (wire.PingJson, PingResult),
    ]  # fmt: skip
    for view, model in pairs:
        assert keys_of(view) == set(model.model_fields), view.__name__
    log_fields = set(models.LogView.model_fields) - {"data_b64"} | {"data"}
    assert keys_of(wire.LogPiece) == log_fields


def test_the_relays_use_rows_have_the_typed_views_keys() -> None:
    from taogpud.relay.usage import Tokens, UseKey, UseTable

    table = UseTable()
    table.record(UseKey(1000, "some-model", 200), Tokens(input=3, output=5))
    assert [set(row) for row in table.rows()] == [keys_of(wire.RelayUseJson)]


def test_a_real_daemons_answers_have_exactly_the_typed_views_keys(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """What the daemon sends, read through the client: the keys each typed view declares."""
    with Client(inprocess_daemon.socket_path) as client:
        job = client.run("noop", wait_s=60.0)
        status = client.status()
        devices = client.devices()
        reload_status = client.config_status()
        health = client.health()
        catalog = client.tasks()
        relay_status = client.relay_status()
        token = client.relay_token()
        revoked = client.relay_revoke()
    assert job["status"] == "succeeded"
    assert set(job) == keys_of(wire.JobJson)
    assert set(job["peer"]) == keys_of(wire.PeerJson)
    assert set(status) == keys_of(wire.StatusJson)
    assert status["workers"] and all(set(w) == keys_of(wire.WorkerJson) for w in status["workers"])
    assert status["arrays"] is not None and set(status["arrays"]) == keys_of(wire.ArraysJson)
    assert status["doors"] and all(set(d) == keys_of(wire.DoorJson) for d in status["doors"])
    assert devices and all(wire.DeviceJson.__required_keys__ <= set(d) for d in devices)
    assert all(set(d) <= keys_of(wire.DeviceJson) for d in devices), devices
    assert set(reload_status) == keys_of(wire.ConfigStatusJson)
    assert set(reload_status["last_reload"]) == keys_of(wire.ReloadJson)
    assert set(health) == keys_of(wire.HealthJson)
    assert catalog and all(set(task) == keys_of(wire.TaskJson) for task in catalog)
    assert set(relay_status) == keys_of(wire.RelayStatusJson)
    assert set(token) == keys_of(wire.RelayTokenJson)
    assert set(revoked) == keys_of(wire.RelayRevokedJson) and revoked["revoked"] is True
