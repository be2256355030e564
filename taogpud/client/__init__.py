"""The Python client of the control API: HTTP/1.1 over the daemon's Unix socket.

Used by `taogpuctl`, the tests and the benchmarks. Two exceptions, one line each (drawn with
the daemon's in taogpud/errors.py, and importable from here):

    DaemonUnreachable   the socket is missing, refuses, is not ours to open, hangs up or is silent
      NotInGroup        the socket belongs to a group this user is not in (group taogpu)
    ApiError            the daemon answered with an error ({code, message, hint}, or anything else)

A `Client` holds one keep-alive connection and is not thread-safe by design: use one Client per
thread (or per process). Nothing here imports numpy unless an array object is uploaded.

Its requests go through a transport (client/transport.py): by default its own HTTP/1.1
connection to the daemon's socket (client/http.py); `Client(transport=MockTransport(handler))`
answers them in this process, for tests of code that uses the client.
"""

from __future__ import annotations

import base64
import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

from taogpud import wire
from taogpud.client.http import UnixHTTPConnection
from taogpud.client.transport import Transport

# The client's exceptions are drawn with the rest (taogpud/errors.py); `as` re-exports them here.
from taogpud.errors import ApiError as ApiError
from taogpud.errors import DaemonUnreachable as DaemonUnreachable
from taogpud.errors import (
    MalformedResponse,
    api_error,
    malformed_response,
    not_json,
    unreachable,
    wrong_json,
)
from taogpud.errors import NotInGroup as NotInGroup
from taogpud.host import paths
from taogpud.wire import FINISHED_STATES, JobRequest, ProgramRequest, Route

# Why not httpx: measured on this kind of host, httpx spends ~416 µs of CPU per request against
# ~120 µs for http.client over the same socket (one keep-alive connection, 1,000 requests),
# and client/http.py's httptools connection less again; the control socket's hot
# path (submit → result of a tiny job) must stay well under 1 ms per job.

WAIT_CHUNK_S = min(1.0, wire.MAX_WAIT_S)  # one long-poll: progress is shown at least this often
RECONNECT_PAUSE_S = 0.2  # a wait whose daemon is away (restarting) tries again this often
PING_WAIT_S = 600.0  # an uncapped channel ping: the daemon bounds it by its own config
FIRST_UPDATE_S = 0.1  # with on_update, how long the submit itself waits: progress starts early
JSON_TYPE = "application/json"
NPY_TYPE = "application/octet-stream"
NPY_MAGIC = b"\x93NUMPY"

Job = wire.JobJson  # a JobRecord as JSON, a typed view (see taogpud.jobs.records.JobRecord)
OnUpdate = Callable[[Job], None]
T = TypeVar("T")
Body = bytes | list[bytes | memoryview] | None  # a list is sent part by part, uncopied


def is_finished(job: Job) -> bool:
    return job.get("status") in FINISHED_STATES


class Client:
    """One keep-alive connection to the daemon. Not thread-safe: one Client per thread."""

    def __init__(
        self,
        socket_path: str | Path | None = None,
        timeout_s: float = 60.0,
        *,
        transport: Transport | None = None,
    ) -> None:
        """transport: where requests go (client/transport.py); None: a connection of its own to
        the daemon's socket. With another transport no socket is opened, `socket_path` (if
        given) only names it in errors, and `compute` sends its arrays over HTTP."""
        if socket_path is not None:
            chosen, tried = Path(socket_path), [Path(socket_path)]
        elif transport is not None:
            chosen, tried = Path(f"<{type(transport).__name__}>"), []
        else:
            chosen, tried = paths.client_sockets()
        self.socket_path = str(chosen)
        self.tried = [str(path) for path in tried]  # named when the chosen one fails
        self.timeout_s = timeout_s
        if transport is None:
            transport = UnixHTTPConnection(self.socket_path, timeout_s)
        self.transport: Transport = transport
        self.shared_memory_bytes = 1 << 30  # compute()'s memfd: its size, sealed once made
        self._shared_arrays: Any = None
        self._shared_lock = threading.Lock()

    # --- daemon and catalog ---------------------------------------------------------------

    def health(self) -> wire.HealthJson:
        return cast(wire.HealthJson, self._dict(wire.HEALTH))

    def info(self) -> dict[str, Any]:
        return self._dict(wire.INFO)

    def status(self) -> wire.StatusJson:
        return cast(wire.StatusJson, self._dict(wire.STATUS))

    def devices(self) -> list[wire.DeviceJson]:
        return cast(list[wire.DeviceJson], self._list(wire.DEVICES))

    def tasks(self) -> list[wire.TaskJson]:
        return cast(list[wire.TaskJson], self._list(wire.TASKS))

    def config(self) -> dict[str, Any]:
        """The daemon's effective config, redacted."""
        return self._dict(wire.CONFIG)

    def reload_config(self) -> wire.ReloadJson:
        """Ask the daemon to re-read both files now; answers how the reload went."""
        return cast(wire.ReloadJson, self._dict(wire.RELOAD_CONFIG))

    def config_status(self) -> wire.ConfigStatusJson:
        return cast(wire.ConfigStatusJson, self._dict(wire.CONFIG_STATUS))

    # --- the API channel and the doctor ---------------------------------------------------

    def channel_ping(self, model: str = "default", timeout_s: float | None = None) -> wire.PingJson:
        """The guide's ping, sent by the daemon (which holds the key); timeout_s caps all of it.

        Answers a PingResult ({ok, status, detail, hint, latency_ms, model, attempts, …})
        whatever the channel did; only a failure to reach the daemon raises.
        """
        query: dict[str, str] = {"model": model}
        if timeout_s is not None:
            query["timeout_s"] = _seconds(timeout_s)
        wait_s = PING_WAIT_S if timeout_s is None else timeout_s
        url = wire.CHANNEL_PING.url(query)
        return cast(wire.PingJson, self._dict(wire.CHANNEL_PING, url, wait_s=wait_s))

    def doctor(
        self, *, ping: bool = True, probe: bool = True, timeout_s: float = 30.0
    ) -> wire.DoctorJson:
        """The daemon-side doctor checks: {ok, checks: [{name, status, detail, hint}], daemon}."""
        query = {
            "ping": str(ping).lower(),
            "probe": str(probe).lower(),
            "timeout_s": _seconds(timeout_s),
        }
        url = wire.DOCTOR.url(query)
        return cast(wire.DoctorJson, self._dict(wire.DOCTOR, url, wait_s=timeout_s))

    # --- the relay (taogpud.relay) --------------------------------------------------------

    def relay_token(self) -> wire.RelayTokenJson:
        """A new relay token for the caller ({uid, token, listen}); the old one stops working."""
        return cast(wire.RelayTokenJson, self._dict(wire.RELAY_TOKEN))

    def relay_revoke(self, uid: int | None = None) -> wire.RelayRevokedJson:
        url = wire.RELAY_REVOKE.url(None if uid is None else {"uid": uid})
        return cast(wire.RelayRevokedJson, self._dict(wire.RELAY_REVOKE, url))

    def relay_status(self) -> wire.RelayStatusJson:
        return cast(wire.RelayStatusJson, self._dict(wire.RELAY_STATUS))

    def relay_models(self) -> tuple[int, bytes]:
        """GET /v1/models through the relay on this socket: (HTTP status, body)."""
        route = wire.RELAY_MODELS
        return self._request(route.method, route.path, wait_s=PING_WAIT_S)

    def mcp_call(
        self, tool: str, *, ok: bool, job_id: str | None = None, error_code: str | None = None
    ) -> dict[str, Any]:
        """Tell the daemon of one MCP tool call (`taogpuctl mcp`), for its `mcp.call` trace
        line: {event, uid, job_id} as written (job_id None unless the job is the caller's)."""
        body = {"tool": tool, "ok": ok, "job_id": job_id, "error_code": error_code}
        return self._dict(wire.MCP_CALL, None, body)

    # --- jobs -----------------------------------------------------------------------------

    def submit(
        self,
        task: str,
        params: dict[str, Any] | None = None,
        *,
        inputs: dict[str, str] | None = None,
        device: int | None = None,
        affinity: str | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
        keep_outputs: bool = False,
        max_retries: int = 0,
        wait_s: float | None = None,
    ) -> Job:
        """Queue a job; with `wait_s`, the daemon answers when it finished or after wait_s."""
        request = JobRequest(
            task=task,
            params=params or {},
            inputs=inputs or {},
            device=device,
            affinity=affinity,
            priority=priority,
            timeout_s=timeout_s,
            keep_outputs=keep_outputs,
            max_retries=max_retries,
        )
        url = wire.SUBMIT_JOB.path  # every job's query, written out: 0.5 µs against url()'s 2.8
        if wait_s is not None:
            url += f"?wait_s={_seconds(wait_s)}"
        return self._job(wire.SUBMIT_JOB, url, request._asdict(), wait_s=wait_s or 0.0)

    def run(
        self,
        task: str,
        params: dict[str, Any] | None = None,
        *,
        inputs: dict[str, str] | None = None,
        device: int | None = None,
        affinity: str | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
        keep_outputs: bool = False,
        max_retries: int = 0,
        wait_s: float | None = None,
        on_update: OnUpdate | None = None,
    ) -> Job:
        """Submit and wait until the job finished; `wait_s` bounds the whole wait (None: no bound).

        A tiny job costs one round trip: the submit itself waits up to one chunk (a short one
        when on_update wants to show progress).
        """
        deadline = _deadline(wait_s)
        first_wait_s = _chunk_s(deadline)
        if on_update is not None:
            first_wait_s = min(first_wait_s, FIRST_UPDATE_S)
        job = self.submit(
            task,
            params,
            inputs=inputs,
            device=device,
            affinity=affinity,
            priority=priority,
            timeout_s=timeout_s,
            keep_outputs=keep_outputs,
            max_retries=max_retries,
            wait_s=first_wait_s,
        )
        if on_update is not None:
            on_update(job)
        if is_finished(job) or _left_s(deadline) <= 0:
            return job
        return self.wait(job["id"], timeout_s=_left_s(deadline), on_update=on_update)

    def get(self, job_id: str) -> Job:
        return self._job(wire.GET_JOB, wire.GET_JOB.url(job_id=job_id))

    def list_jobs(self, status: str | None = None, limit: int = 100) -> list[Job]:
        """Newest first."""
        query: dict[str, str | int] = {"limit": limit}
        if status is not None:
            query["status"] = status
        return cast(list[Job], self._list(wire.LIST_JOBS, wire.LIST_JOBS.url(query)))

    def cancel(self, job_id: str) -> Job:
        return self._job(wire.CANCEL_JOB, wire.CANCEL_JOB.url(job_id=job_id))

    def wait(
        self, job_id: str, timeout_s: float | None = None, on_update: OnUpdate | None = None
    ) -> Job:
        """Long-poll until the job finished or timeout_s passed; the latest record either way.
        Rides through a restart of the daemon (an upgrade's): reconnects for up to the
        client's timeout_s before DaemonUnreachable."""
        deadline = _deadline(timeout_s)
        while True:
            job = self._wait_chunk(job_id, deadline)
            if on_update is not None:
                on_update(job)
            if is_finished(job) or _left_s(deadline) <= 0:
                return job

    def _wait_chunk(self, job_id: str, deadline: float | None) -> Job:
        """One long-poll, tried again while the daemon is away (its socket gone, or the
        daemon gone mid-answer), for up to timeout_s; the job is the store's, not the
        daemon's, so the next one answers for it."""
        away_since: float | None = None
        while True:
            chunk_s = _chunk_s(deadline)
            url = wire.WAIT_JOB.url({"timeout_s": _seconds(chunk_s)}, job_id=job_id)
            try:
                return self._job(wire.WAIT_JOB, url, wait_s=chunk_s)
            except NotInGroup:
                raise
            except DaemonUnreachable as exc:
                if isinstance(exc.__cause__, TimeoutError):
                    raise  # a daemon there but silent for a whole long-poll: not a restart
                away_since = away_since or time.monotonic()
                if time.monotonic() - away_since > self.timeout_s or _left_s(deadline) <= 0:
                    raise
                time.sleep(RECONNECT_PAUSE_S)

    # --- programs: your own, under a lease (docs/programs.md) --------------------------------

    def submit_program(
        self,
        argv: list[str],
        *,
        cwd: str | None = None,
        name: str | None = None,
        gpus: int = 1,
        device: int | None = None,
        mem_bytes: int | None = None,
        share: bool = False,
        affinity: str | None = None,
        priority: int = 0,
        timeout_s: float | None = None,
    ) -> Job:
        """Queue a program that this process will start once its lease is granted
        (`taogpud.client.program.run_program` does all of it)."""
        request = ProgramRequest(
            argv=list(argv),
            cwd=cwd or str(Path.cwd()),
            name=name,
            gpus=gpus,
            device=device,
            mem_bytes=mem_bytes,
            share=share,
            affinity=affinity,
            priority=priority,
            timeout_s=timeout_s,
        )
        return self._job(wire.SUBMIT_PROGRAM, payload=request._asdict())

    def lease(self, job_id: str, after: str | None = None, wait_s: float = 0.0) -> wire.LeaseJson:
        """A program's lease: {phase, queue_position, job}; with `after`, once its phase is
        another (or after wait_s)."""
        query: dict[str, str] = {"wait_s": _seconds(wait_s)}
        if after is not None:
            query["after"] = after
        url = wire.PROGRAM_LEASE.url(query, job_id=job_id)
        return cast(wire.LeaseJson, self._dict(wire.PROGRAM_LEASE, url, wait_s=wait_s))

    def program_started(self, job_id: str, pid: int) -> Job:
        url = wire.PROGRAM_STARTED.url(job_id=job_id)
        return self._job(wire.PROGRAM_STARTED, url, {"pid": pid})

    def append_program_log(self, job_id: str, data: bytes) -> None:
        """Output of a program this process runs (a detached one's supervisor)."""
        route = wire.PROGRAM_LOG_APPEND
        status, body = self._request(route.method, route.url(job_id=job_id), data, NPY_TYPE)
        if status >= 400:
            raise api_error(status, body)

    def program_log(self, job_id: str, offset: int = 0, wait_s: float = 0.0) -> wire.LogPiece:
        """A piece of a program's log: {data (bytes), next, ended}."""
        query = {"offset": offset, "wait_s": _seconds(wait_s)}
        url = wire.PROGRAM_LOG.url(query, job_id=job_id)
        piece = self._dict(wire.PROGRAM_LOG, url, wait_s=wait_s)
        data = base64.b64decode(piece["data_b64"])
        return {"data": data, "next": piece["next"], "ended": piece["ended"]}

    def program_exited(self, job_id: str, **how: Any) -> Job:
        """How it ended: exit_code, signal ("SIGKILL"), cancelled, not_started (why)."""
        url = wire.PROGRAM_EXITED.url(job_id=job_id)
        return self._job(wire.PROGRAM_EXITED, url, how)

    # --- arrays ---------------------------------------------------------------------------

    def upload_array(self, array_or_npy_bytes: Any) -> wire.ArrayJson:
        """Store an array (a numpy array, or the bytes of a .npy file) as a job input."""
        body = _npy_parts(array_or_npy_bytes)
        route = wire.UPLOAD_ARRAY
        status, data = self._request(route.method, route.path, body, NPY_TYPE)
        answer = _expect(_decode_json(status, data), dict, route.path)
        return cast(wire.ArrayJson, answer)

    def download_output(self, job_id: str, name: str) -> bytes:
        """The bytes of a .npy file: one output the job kept (submit with keep_outputs)."""
        route = wire.JOB_OUTPUT
        status, data = self._request(route.method, route.url(job_id=job_id, name=name))
        if status >= 400:
            raise api_error(status, data)
        return data

    # --- numpy in, numpy out (client/shm.py) ------------------------------------------------

    def compute(self, task: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """Run `task` on ndarrays (`a=…, b=…`): its outputs as ndarrays, `.job` the record.
        Through this process's shared memory on this host, else the HTTP body."""
        return self._shared().compute(task, params, **kwargs)

    def begin_compute(self, task: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Any:
        """As `compute`, but returns once the job is sent: `.result()` gives its outputs.
        Several may be in flight on the one connection (up to the daemon's max_in_flight)."""
        return self._shared().begin_compute(task, params, **kwargs)

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = "float32") -> Any:
        """An ndarray in the shared memory `compute` hands to the worker without a copy."""
        return self._shared().empty(shape, dtype)

    def _shared(self) -> Any:
        with self._shared_lock:  # threads that compute at once share one connection
            if self._shared_arrays is None:
                from taogpud.memfd.client import SharedArrays

                unix = self.transport if isinstance(self.transport, UnixHTTPConnection) else None
                http_socket = unix.socket_path if unix is not None else None
                self._shared_arrays = SharedArrays(self, http_socket, self.shared_memory_bytes)
            return self._shared_arrays

    # --- connection -----------------------------------------------------------------------

    def close(self) -> None:
        self.transport.close()
        if self._shared_arrays is not None:
            self._shared_arrays.close()
            self._shared_arrays = None

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def _dict(
        self, route: Route, url: str | None = None, payload: Any = None, *, wait_s: float = 0.0
    ) -> dict[str, Any]:
        """`route` at `url` (its path filled in; default: the path as it is), a JSON object."""
        url = route.path if url is None else url
        return _expect(self._json(route.method, url, payload, wait_s), dict, url)

    def _job(
        self, route: Route, url: str | None = None, payload: Any = None, *, wait_s: float = 0.0
    ) -> Job:
        """`_dict`, read as a job record (the view is for mypy: the JSON is not checked)."""
        return cast(Job, self._dict(route, url, payload, wait_s=wait_s))

    def _list(self, route: Route, url: str | None = None) -> list[dict[str, Any]]:
        url = route.path if url is None else url
        return _expect(self._json(route.method, url, None, 0.0), list, url)

    def _json(self, method: str, path: str, payload: Any, wait_s: float) -> Any:
        body = None if payload is None else _orjson().dumps(payload)
        status, data = self._request(method, path, body, JSON_TYPE, wait_s)
        return _decode_json(status, data)

    def _request(
        self,
        method: str,
        path: str,
        body: Body = None,
        content_type: str = JSON_TYPE,
        wait_s: float = 0.0,
    ) -> tuple[int, bytes]:
        """One exchange through the transport, its failures as DaemonUnreachable or ApiError
        (a kept-alive connection the daemon closed is the transport's to reopen, once)."""
        read_timeout_s = self.timeout_s + wait_s  # a long-poll answers only after wait_s
        try:
            return self.transport.request(method, path, body, content_type, read_timeout_s)
        except MalformedResponse as exc:
            raise malformed_response(self.socket_path, exc) from exc
        except OSError as exc:  # ConnectionError included
            self.transport.close()
            raise unreachable(self.socket_path, exc, read_timeout_s, self.tried) from exc


# --- helpers ------------------------------------------------------------------------------


def _deadline(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


def _left_s(deadline: float | None) -> float:
    return float("inf") if deadline is None else deadline - time.monotonic()


def _chunk_s(deadline: float | None) -> float:
    return max(0.0, min(WAIT_CHUNK_S, _left_s(deadline)))


def _seconds(value_s: float) -> str:
    return f"{value_s:.3f}"


def _npy_parts(array_or_npy_bytes: Any) -> list[bytes | memoryview]:
    """A .npy image as [header, the array's own memory]: sent as it is, never copied whole
    (np.save into a buffer made two copies and was most of a large upload's client time)."""
    if isinstance(array_or_npy_bytes, bytes | memoryview):
        return [memoryview(array_or_npy_bytes).cast("B")]
    import numpy as np

    array = np.asarray(array_or_npy_bytes, order="C")  # keeps 0-d (ascontiguousarray would not)
    header = wire.npy_header(tuple(array.shape), array.dtype.str)
    return [header, array.reshape(-1).data.cast("B") if array.size else b""]


def _expect(value: object, kind: type[T], path: str) -> T:
    if not isinstance(value, kind):
        raise wrong_json(path, value, kind)
    return value


def _orjson() -> Any:
    """orjson, imported on first use, for the bodies sent: a call that sends none (`taogpuctl
    status`) never loads it, nor the dataclasses, inspect and uuid it loads (bench/cli_start.py:
    a third of such a call's own CPU)."""
    import orjson

    return orjson


def _decode_json(status: int, data: bytes) -> Any:
    """Answers are read with the standard library's json, one way for every caller: orjson
    decodes a job record faster, but in one A/B run (bench/ab.py: the client's answers and
    bodies on orjson, then on json) the tiny-job p50 moved 5.8%, within the 10% a second way
    must earn, and its import is a third of a one-shot call's own CPU."""
    if status >= 400:
        raise api_error(status, data)
    try:
        return json.loads(data)
    except ValueError:  # json's JSONDecodeError is one
        raise not_json(status, data) from None
