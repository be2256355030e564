"""POST /v1/jobs served by the connection's protocol itself: the one route every job takes.

Measured with py-spy on a tiny-job stream (bench/run.py's dispatch): FastAPI's middleware,
routing and dependency layers took about 29% of the daemon's CPU per job, more than the
submit itself, so a submit went from uvicorn straight to the scheduler as an ASGI layer.
Then uvicorn's own part stood out: a task per request, the ASGI messages, and a response
head checked and written apart from its body. Now the protocol (api/protocol.py) hands a
submit's request to `JobSubmits` once its body is whole, with no task: the job goes to the
scheduler at once and its answer is written in one piece, now or from the callback that
sees the job finish. In an A/B of that change: p50 0.50–0.54 → 0.46 ms, and 40–60 µs less of
the daemon's CPU per tiny job.

Only the happy path is ours. A request this path does not take (a query other than
`wait_s`, not JSON, a body over 64 KiB, `Expect: 100-continue`) or a body that fails
validation goes to the FastAPI route in api/jobs.py like any other request, with its body
already read: every such error keeps the one shape and wording the rest of the API has, and
the route stays the documented one in the OpenAPI document. Errors the scheduler raises
are answered here, with the body the framework's handler would give.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections.abc import Callable

from pydantic import ValidationError
from uvicorn.protocols.http.flow_control import HIGH_WATER_LIMIT
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, RequestResponseCycle

from taogpud import trace
from taogpud.api.app import error_response, internal_error
from taogpud.api.models import JobRequest
from taogpud.api.peer import SCOPE_KEY
from taogpud.errors import TaogpudError
from taogpud.jobs import Peer
from taogpud.logging import request_trace_enabled
from taogpud.state import DaemonState
from taogpud.store import JobStore

ROUTE = "/v1/jobs"
MAX_WAIT_S = 60.0  # the same bound the FastAPI route declares for wait_s
# uvicorn stops reading a body past this until the application reads it, and this path
# reads only whole bodies: a bigger one (no tiny job's) goes to the framework.
MAX_BODY_BYTES = HIGH_WATER_LIMIT


class JobSubmits:
    """Takes well-formed submits off uvicorn's request cycle (see the module's docstring)."""

    def __init__(self, state: DaemonState) -> None:
        self.state = state

    def takes(self, cycle: RequestResponseCycle) -> bool:
        """Whether this path serves the request whose head was just read."""
        scope = cycle.scope
        if scope["method"] != "POST" or scope["path"] != ROUTE:
            return False
        declared = _declared_length(cycle)
        return (
            declared is not None
            and declared <= min(MAX_BODY_BYTES, self.state.max_json_bytes)
            and not cycle.waiting_for_100_continue
            and _wait_s(scope["query_string"]) is not None
            and _is_json(cycle)
        )

    def serve(
        self, cycle: RequestResponseCycle, to_framework: Callable[[], None]
    ) -> WaitingAnswer | None:
        """The request's body is whole: submit, and answer now or once the job finished
        (or wait_s passed). Returns the answer still to come, if any."""
        started = time.perf_counter()
        try:
            request = JobRequest.model_validate_json(cycle.body)
        except ValidationError:
            to_framework()  # it explains what is wrong, in the API's one error shape
            return None
        peer = _peer(cycle)
        loop = asyncio.get_running_loop()
        try:
            job = self.state.scheduler.submit(request, peer)
        except TaogpudError as exc:
            refused = error_response(exc.http_status, exc.body())
            loop.call_soon(self._answer, cycle, exc.http_status, refused.body, started, peer)
            return None
        except Exception as exc:  # a bug: logged with its traceback, answered as a 500
            loop.call_soon(self._answer, cycle, 500, internal_error(ROUTE, exc).body, started, peer)
            return None
        wait_s = _wait_s(cycle.scope["query_string"]) or 0.0
        answer = functools.partial(self._answer_job, cycle, job.id, started, peer)
        waiting = WaitingAnswer(self.state.store, job.id, wait_s, answer)
        if waiting.pending:
            return waiting
        # Not from inside the parser's callback: a pipelined request behind this one is read
        # first and waits its turn, as uvicorn has it, instead of starting in the middle.
        loop.call_soon(answer)
        return None

    def _answer_job(
        self, cycle: RequestResponseCycle, job_id: str, started: float, peer: Peer
    ) -> None:
        """The job as it is now, stored before it is shown."""
        try:
            body = self.state.scheduler.commit(job_id).encode()
        except TaogpudError as exc:  # a full disk: refused, and the job withdrawn
            refused = error_response(exc.http_status, exc.body())
            self._answer(cycle, exc.http_status, refused.body, started, peer)
            return
        except Exception as exc:  # no client is left without an answer
            self._answer(cycle, 500, internal_error(ROUTE, exc).body, started, peer)
            return
        self._answer(cycle, 201, body, started, peer)

    def _answer(
        self,
        cycle: RequestResponseCycle,
        status: int,
        body: bytes | memoryview,
        started: float,
        peer: Peer,
    ) -> None:
        write_json_answer(cycle, status, bytes(body))
        if request_trace_enabled():  # after the job's own lines, which wait for the loop
            trace.deferred(
                "info",
                "api.request",
                method="POST",
                path=ROUTE,
                status=status,
                duration_ms=round((time.perf_counter() - started) * 1e3, 3),
                uid=peer.uid,
            )


class WaitingAnswer:
    """A submit's answer that waits for its job: given once, when the job finished, when
    wait_s passed, or at once when the server stops (the job as it is then)."""

    def __init__(
        self, store: JobStore, job_id: str, wait_s: float, answer: Callable[[], None]
    ) -> None:
        self._store = store
        self._job_id = job_id
        self._answer = answer
        self.pending = bool(wait_s) and self._store.when_finished(job_id, self.give)
        if self.pending:
            self._timer = asyncio.get_running_loop().call_later(wait_s, self.give)

    def give(self) -> None:
        if self.pending:
            self.drop()
            self._answer()

    def drop(self) -> None:
        """Never answer (the client hung up); the job runs on."""
        if self.pending:
            self.pending = False
            self._timer.cancel()
            self._store.forget(self._job_id, self.give)


def write_json_answer(cycle: RequestResponseCycle, status: int, body: bytes) -> None:
    """What uvicorn's send() writes for a JSON response, in one write (it writes the head and
    the body apart: two system calls, and often two reads for the client), then what it does
    once a response is complete: close unless kept alive, then the next pipelined request
    or the keep-alive timer."""
    if cycle.disconnected or cycle.transport.is_closing():
        return
    head = [STATUS_LINE[status]]
    for name, value in cycle.default_headers:  # server and date, as on every other answer
        head += [name, b": ", value, b"\r\n"]
    head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(body))
    if not cycle.keep_alive:
        head.append(b"connection: close\r\n")
    head += [b"\r\n", body]
    cycle.transport.write(b"".join(head))
    cycle.response_started = cycle.response_complete = True
    if not cycle.keep_alive:
        cycle.transport.close()
    cycle.on_response()


def _wait_s(query: bytes) -> float | None:
    """0.0 for no wait, the seconds asked for, or None when the query is not the plain
    `wait_s=S` this path serves (the framework then explains what is wrong)."""
    if not query:
        return 0.0
    name, _, value = query.partition(b"=")
    if name != b"wait_s" or b"&" in value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) and 0 <= seconds <= MAX_WAIT_S else None


def _is_json(cycle: RequestResponseCycle) -> bool:
    for name, value in cycle.scope["headers"]:
        if name == b"content-type":
            media_type: bytes = value.split(b";")[0].strip().lower()
            return media_type == b"application/json"
    return False


def _declared_length(cycle: RequestResponseCycle) -> int | None:
    for name, value in cycle.scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else None
    return None


def _peer(cycle: RequestResponseCycle) -> Peer:
    peer = cycle.scope.get("extensions", {}).get(SCOPE_KEY)
    return peer if isinstance(peer, Peer) else Peer()
