"""Trace and job events through the API (GET /v1/trace, GET /v1/jobs/{id}/events), and the
commands that read them: `trace --grep`, `logs ID [-f]`, `status --watch`. Each test reads its
own jobs' lines, on the module's one in-process daemon where no other uid or file is needed."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest

from taogpud.client.stream import stream_lines
from taogpud.testing import Ctl
from tests.test_cli import assert_one_error_line, json_out

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("cli_logs")

NOBODY = 65534  # the uid the other-user check acts as


def cli_command(daemon: Any) -> list[str]:
    """taogpuctl aimed at `daemon`, to run as a process of its own (to be sent a Ctrl-C)."""
    return [sys.executable, "-m", "taogpud.cli", "--socket", str(daemon.socket_path)]


def test_trace_grep_backend_lists_the_jobs_lines(module_inprocess_ctl: Ctl) -> None:
    """`trace --grep backend`: JSON lines, each holding "backend", the finished job among them."""
    job_id = json_out(
        module_inprocess_ctl("submit", "vector_add", "--size", "1000", "--wait", "--json")
    )["id"]
    result = module_inprocess_ctl("trace", "--grep", "backend")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line) for line in result.stdout.splitlines()]
    assert events and all("backend" in line for line in result.stdout.splitlines())
    finished = [e for e in events if e.get("job_id") == job_id and e["event"] == "job.succeeded"]
    assert finished and finished[0]["backend"] == "cpu"


def test_logs_follow_prints_lines_as_they_happen_and_ends_with_the_job(
    module_inprocess_daemon: Any,
) -> None:
    """`logs ID -f` of a 2.5 s sleep: the running line arrives while it runs; the command ends
    (exit 0) after the job's last line."""
    with module_inprocess_daemon.client() as client:
        job_id = client.submit("sleep", {"ms": 2500})["id"]
    command = cli_command(module_inprocess_daemon)
    with subprocess.Popen(
        [*command, "logs", job_id, "-f"], stdout=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stdout is not None
        lines = [proc.stdout.readline(), proc.stdout.readline()]
        seen_running_at = time.time()
        rest, _ = proc.communicate(timeout=30)
    assert " job.queued " in lines[0] and " job.running " in lines[1], lines
    with module_inprocess_daemon.client() as client:
        finished_at = client.get(job_id)["finished_at"]
    # Before the job's end (the daemon's clock is this process's): followed, not read after.
    assert finished_at is not None and seen_running_at < finished_at
    assert " job.succeeded status=succeeded " in rest
    assert "fallback=false" in rest
    assert proc.returncode == 0


def test_logs_of_a_finished_job_and_unknown_ids(module_inprocess_ctl: Ctl) -> None:
    """`logs ID` of a finished job prints its lines and ends; an unknown id is exit 2."""
    job_id = json_out(module_inprocess_ctl("submit", "noop", "--wait", "--json"))["id"]
    result = module_inprocess_ctl("logs", job_id, "--json")
    assert result.returncode == 0, result.stderr
    events = [json.loads(line)["event"] for line in result.stdout.splitlines()]
    assert events[-1] == "job.succeeded"
    assert assert_one_error_line(module_inprocess_ctl("logs", "ffffffffffffffffff"), 2)


def test_events_endpoint_answers_ndjson_and_the_error_shape(module_inprocess_daemon: Any) -> None:
    """GET /v1/jobs/{id}/events: one JSON object per line; unknown job → job_not_found."""
    with module_inprocess_daemon.client() as client:
        job_id = client.run("noop")["id"]
    events = list(
        stream_lines(str(module_inprocess_daemon.socket_path), f"/v1/jobs/{job_id}/events")
    )
    assert {event["job_id"] for event in events} == {job_id}
    with pytest.raises(Exception, match="no job") as caught:
        list(stream_lines(str(module_inprocess_daemon.socket_path), "/v1/jobs/nope/events"))
    assert getattr(caught.value, "code", None) == "job_not_found"


def test_trace_follow_stops_on_ctrl_c(module_inprocess_daemon: Any) -> None:
    """`trace -f` prints new lines as they come; Ctrl-C ends it with 130 and no traceback."""
    command = cli_command(module_inprocess_daemon)
    with module_inprocess_daemon.client() as client:
        client.run("noop")  # a job.succeeded line for the backlog
    with subprocess.Popen(
        [*command, "trace", "-f", "--grep", "job.succeeded", "--limit", "1"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        assert "job.succeeded" in proc.stdout.readline()  # the backlog's last: it reads on
        with module_inprocess_daemon.client() as client:
            job_id = client.run("noop")["id"]  # after the backlog: only a follow shows it
        line = ""
        while job_id not in line:
            line = proc.stdout.readline()
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert "Traceback" not in err


def test_status_watch_redraws_until_ctrl_c(module_inprocess_daemon: Any) -> None:
    """`status --watch --interval 0.2` redraws the status; Ctrl-C ends it cleanly."""
    command = cli_command(module_inprocess_daemon)
    with subprocess.Popen(
        [*command, "status", "--watch", "--interval", "0.2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        assert proc.stdout is not None
        seen, deadline = [], time.monotonic() + 60  # a loaded host may start the CLI slowly
        while sum("backend cpu" in line for line in seen) < 2 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break  # it exited: the assertion below shows what it printed
            seen.append(line)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=30)
    assert "".join([*seen, out]).count("backend cpu") >= 2, "".join(seen) + out + err
    assert "Traceback" not in err


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another uid")
def test_another_uid_sees_only_its_own_job_lines(daemon: Any) -> None:
    """uid 65534 reading the trace sees its own job and not root's; root's job's events are
    forbidden to it, as its outputs are."""
    with daemon.client() as client:
        root_job = client.run("noop")["id"]
    for folder in (daemon.home.parent, daemon.home):
        folder.chmod(0o755)
    daemon.socket_path.chmod(0o666)
    script = f"""
import os
from taogpud.client import ApiError, Client
from taogpud.client.stream import stream_lines
os.setgroups([]); os.setgid({NOBODY}); os.setuid({NOBODY})
client = Client({str(daemon.socket_path)!r})
own = client.run("noop")["id"]
seen = {{e.get("job_id") for e in stream_lines(client.socket_path, "/v1/trace?limit=20000")}}
print(own in seen, {root_job!r} in seen)
try:
    list(stream_lines(client.socket_path, "/v1/jobs/{root_job}/events"))
    print("allowed")
except ApiError as exc:
    print(exc.code)
"""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "False", "forbidden"]


def test_trace_file_is_where_the_guides_grep_looks(daemon_factory: Any, daemon_home: Any) -> None:
    """settings.json logging.file: every trace line is appended there too (mode 0600), so
    `grep backend FILE` finds the job with its backend; an unwritable path refuses to start."""
    trace_file = daemon_home / "trace.log"
    daemon = daemon_factory(settings={"logging": {"file": str(trace_file)}})
    with daemon.client() as client:
        job_id = client.run("vector_add", {"size": 100})["id"]
    daemon.stop()
    lines = [json.loads(line) for line in trace_file.read_text().splitlines() if "backend" in line]
    finished = [e for e in lines if e.get("job_id") == job_id and e["event"] == "job.succeeded"]
    assert finished and finished[0]["backend"] == "cpu"
    assert trace_file.stat().st_mode & 0o777 == 0o600
    refused = daemon_factory(
        settings={"logging": {"file": str(daemon_home / "absent" / "trace.log")}}, wait_ready=False
    )
    assert refused.proc.wait(timeout=60) == 2
    assert "logging.file cannot be written" in refused.stderr()
