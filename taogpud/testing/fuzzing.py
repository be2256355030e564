"""Schemathesis against a running daemon's own OpenAPI document, over its Unix socket.

Every generated request must get an answer that is not a server error, and every
4xx/5xx must carry the one error shape {code, message, hint}. Used by
tests/test_fuzz.py (a few hundred cases) and scripts/soak.py (thousands). Needs the dev
extra (hypothesis, schemathesis): nothing of the daemon imports this module.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis.checks import not_a_server_error

BASE_URL = "http://taogpud"
# Settings for a daemon under fuzz: tiny memory caps so no generated job can eat the host,
# a short drain so the daemon stops quickly however many sleeps were queued.
# The API channel points at a closed loopback port (9, discard): pings stay on this machine.
CLOSED_URL = "http://127.0.0.1:9/api"
FUZZ_SETTINGS: dict[str, Any] = {
    "gpu": {"memoryFraction": 0.01},
    "provider": {"baseUrl": CLOSED_URL, "maxRetries": 0},
}
FUZZ_CONFIG: dict[str, Any] = {
    "scheduling": {"drain_timeout_s": 1, "queue_limit": 50},
    "api": {"base_url": CLOSED_URL},
}


@dataclass
class FuzzReport:
    cases: int = 0
    failures: list[str] = field(default_factory=list)


def fuzz(socket_path: Path, examples_per_operation: int) -> FuzzReport:
    report = FuzzReport()
    with httpx.Client(transport=httpx.HTTPTransport(uds=str(socket_path)), timeout=30) as http:
        document = http.get(f"{BASE_URL}/v1/openapi.json").json()
        schema = schemathesis.openapi.from_dict(document)
        for result in schema.get_all_operations():
            # an operation the document cannot describe (an Err) fails the run here
            operation = result.ok()  # type: ignore[union-attr]
            _fuzz_operation(http, operation, examples_per_operation, report)
            _end_jobs_in_hand(http)
    return report


def _end_jobs_in_hand(http: httpx.Client) -> None:
    """Each operation starts with no job in hand: every queued job and every program is
    cancelled (a running task ends on its own). A program lease the fuzz was granted (this
    process its live client, which never starts anything) ends at once too, but its devices
    stay held until its starter answers or REVOKE_GRACE_S passes (docs/programs.md, "A lease
    never started"): the fuzz answers as that starter, that it never started one (POST
    …/exited not_started), so they come back now, and the doctor's probes, fuzzed later, do
    not wait out the grace behind them. One pass: a program placed meanwhile is ended too."""
    jobs = http.get(f"{BASE_URL}/v1/jobs", params={"limit": 500}).json()
    for job in jobs:
        program = job["task"] == "program"
        if not (job["status"] == "queued" or (program and job["status"] == "running")):
            continue
        http.post(f"{BASE_URL}/v1/jobs/{job['id']}/cancel")
        if program:  # ended now, granted or not: the word gives a revoked lease back
            url = f"{BASE_URL}/v1/programs/{job['id']}/exited"
            http.post(url, json={"not_started": "the fuzz never starts its programs"})


def _fuzz_operation(http: httpx.Client, operation: Any, examples: int, report: FuzzReport) -> None:
    @given(case=operation.as_strategy())
    @settings(
        max_examples=examples,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    def run(case: Any) -> None:
        report.cases += 1
        kwargs = case.as_transport_kwargs(base_url=BASE_URL)
        kwargs.pop("timeout", None)
        response = http.request(**_httpx_kwargs(kwargs))
        problem = _problem(case, response)
        if problem:
            report.failures.append(f"{case.method} {case.formatted_path}: {problem}")

    run()


def _httpx_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    allowed = {"method", "url", "headers", "params", "content", "json", "data", "files"}
    picked = {key: value for key, value in kwargs.items() if key in allowed}
    if isinstance(picked.get("data"), bytes | str):  # raw bodies go as content= in httpx
        picked["content"] = picked.pop("data")
    return picked


def _problem(case: Any, response: httpx.Response) -> str | None:
    try:
        case.validate_response(response, checks=[not_a_server_error])
    except Exception as exc:  # schemathesis raises its own failure types
        return f"{response.status_code}: {str(exc).splitlines()[0]}"
    if response.status_code >= 400:
        try:
            body = response.json()
        except ValueError:
            return f"{response.status_code} without a JSON body"
        if not (isinstance(body, dict) and set(body) == {"code", "message", "hint"}):
            return f"{response.status_code} with a body not shaped {{code, message, hint}}: {body}"
    return None
