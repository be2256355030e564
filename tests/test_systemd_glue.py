"""The systemd glue without systemd: sd_notify against a real datagram socket, the
heartbeat, socket activation through systemd-socket-activate, and the journal's native
protocol against a socket standing in for journald. No root needed.
"""

from __future__ import annotations

import asyncio
import calendar
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import structlog

from taogpud.client import Client
from taogpud.host import systemd
from taogpud.observability import journal, trace
from taogpud.observability import logging as tlog
from taogpud.testing import CPU_CONFIG, CPU_SETTINGS, RunningDaemon, write_pair

SECRET = "tt-sk-glue-5e3a9c71d4"


class NotifySocket:
    """A datagram socket standing in for systemd's NOTIFY_SOCKET (or journald's socket)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(str(path))
        self.sock.settimeout(0.05)

    def drain(self) -> list[bytes]:
        got = []
        while True:
            try:
                got.append(self.sock.recv(1 << 20))
            except TimeoutError:
                return got

    def messages(self) -> list[dict[str, str]]:
        return [dict(line.split("=", 1) for line in m.decode().split("\n")) for m in self.drain()]

    def wait_for(
        self, predicate: Callable[[dict[str, str]], bool], timeout_s: float = 30
    ) -> list[dict[str, str]]:
        """Every message up to and including the first that matches."""
        seen: list[dict[str, str]] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            for message in self.messages():
                seen.append(message)
                if predicate(message):
                    return seen
        raise AssertionError(f"no matching notification within {timeout_s} s: {seen}")


@pytest.fixture
def notify_socket(daemon_home: Path) -> Iterator[NotifySocket]:
    stand_in = NotifySocket(daemon_home / "notify")
    yield stand_in
    stand_in.sock.close()


# --- Notifier ---------------------------------------------------------------------------


def test_notifier_is_a_no_op_outside_systemd() -> None:
    """Without NOTIFY_SOCKET nothing is sent, no watchdog is armed, nothing raises."""
    notifier = systemd.Notifier(environ={})
    notifier.ready("x")
    notifier.reloading()
    notifier.watchdog()
    assert (notifier.enabled, notifier.watchdog_s, notifier.send("READY=1")) == (False, None, False)


def test_notifier_reaches_an_abstract_socket() -> None:
    """NOTIFY_SOCKET=@name is the abstract socket "\\0name"; a dead socket is no error."""
    name = f"taogpud-test-{os.getpid()}"
    stand_in = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    stand_in.bind("\0" + name)
    with stand_in:
        notifier = systemd.Notifier(environ={"NOTIFY_SOCKET": "@" + name})
        assert notifier.send("READY=1") is True
        assert stand_in.recv(64) == b"READY=1"
        notifier.close()
    gone = systemd.Notifier(environ={"NOTIFY_SOCKET": "/nonexistent/notify"})
    assert gone.enabled and gone.send("READY=1") is False
    gone.close()


def test_notifier_speaks_for_the_daemon_only(
    notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """READY=1 with an ASCII STATUS=; the notify and watchdog variables leave the environment."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    monkeypatch.setenv("WATCHDOG_USEC", "4000000")
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()))
    notifier = systemd.Notifier()
    notifier.ready("cpu: workers 2/2 warm — café\nnext")
    notifier.stopping("draining 1 running jobs")
    notifier.watchdog()
    notifier.close()
    assert notify_socket.messages() == [
        {"READY": "1", "STATUS": "cpu: workers 2/2 warm ? caf? next"},
        {"STOPPING": "1", "STATUS": "draining 1 running jobs"},
        {"WATCHDOG": "1"},
    ]
    assert notifier.watchdog_s == 4.0
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        assert name not in os.environ  # spawned workers cannot speak for the daemon


def test_reloading_carries_the_monotonic_clock(
    notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """RELOADING=1 comes with MONOTONIC_USEC (CLOCK_MONOTONIC, µs); READY=1 keeps the status."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    notifier = systemd.Notifier()
    notifier.status("generation 1")
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    notifier.reloading()
    notifier.ready()
    notifier.close()
    after = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    _, reloading, ready = notify_socket.messages()
    assert reloading["RELOADING"] == "1"
    assert before <= int(reloading["MONOTONIC_USEC"]) <= after
    assert ready == {"READY": "1", "STATUS": "reloading configuration"}


def test_watchdog_is_armed_only_for_this_process() -> None:
    """WATCHDOG_USEC counts only when WATCHDOG_PID is ours (or absent)."""
    env = {"NOTIFY_SOCKET": "/nonexistent", "WATCHDOG_USEC": "30000000"}
    other = {**env, "WATCHDOG_PID": str(os.getpid() + 1)}
    zero = {**env, "WATCHDOG_USEC": "0"}
    periods = []
    for environ in (dict(env), other, zero):
        notifier = systemd.Notifier(environ=environ)
        periods.append(notifier.watchdog_s)
        notifier.close()
    assert periods == [30.0, None, None]


def test_heartbeat_sends_watchdog_only_while_healthy(
    notify_socket: NotifySocket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each tick: STATUS= only when it changed, WATCHDOG=1 only when the health check passed."""
    monkeypatch.setenv("NOTIFY_SOCKET", str(notify_socket.path))
    monkeypatch.setenv("WATCHDOG_USEC", "200000")  # ticks every 50 ms
    notifier = systemd.Notifier()
    health = iter([True, True, False, False, True])
    status = iter(["a", "a", "b", "b", "b"])  # then "b" again: nothing new to send

    async def five_ticks() -> None:
        sixth_tick = asyncio.Event()  # five ticks told, however late a loaded host ran them

        async def healthy(timeout_s: float) -> bool:
            assert timeout_s == pytest.approx(0.05)
            answer = next(health, None)
            if answer is None:
                sixth_tick.set()
                await asyncio.Event().wait()  # until cancelled
            return bool(answer)

        beats = systemd.heartbeat(notifier, lambda: next(status, "b"), healthy)
        task = asyncio.create_task(beats)
        await sixth_tick.wait()
        task.cancel()

    asyncio.run(five_ticks())
    notifier.close()
    assert notify_socket.messages() == [
        {"STATUS": "a"},
        {"WATCHDOG": "1"},
        {"WATCHDOG": "1"},
        {"STATUS": "b"},
        {"WATCHDOG": "1"},
    ]


# --- the daemon, notifying --------------------------------------------------------------


def test_daemon_notifies_ready_watchdog_and_reload(
    daemon_factory: Callable[..., RunningDaemon], notify_socket: NotifySocket
) -> None:
    """READY=1 once warm, workers in STATUS=; WATCHDOG=1 ticks; SIGHUP: RELOADING=1, READY=1."""
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "2000000"}
    daemon = daemon_factory(env=env)
    seen = notify_socket.wait_for(lambda m: "READY" in m)
    assert seen[-1]["STATUS"].startswith("cpu: workers 2/2 warm (cpu:0 cpu:1), running 0, queued 0")
    notify_socket.wait_for(lambda m: m == {"WATCHDOG": "1"}, timeout_s=5)
    daemon.proc.send_signal(signal.SIGHUP)
    seen = notify_socket.wait_for(lambda m: "READY" in m, timeout_s=15)
    reloading = [m for m in seen if "RELOADING" in m]
    assert reloading and "MONOTONIC_USEC" in reloading[0]
    assert seen.index(reloading[0]) < len(seen) - 1  # READY=1 after RELOADING=1
    child_env = Path(f"/proc/{daemon.events('worker.warm')[0]['pid']}/environ").read_bytes()
    assert b"NOTIFY_SOCKET=" not in child_env and b"WATCHDOG_USEC=" not in child_env


def test_daemon_withholds_watchdog_while_a_worker_does_not_answer(
    daemon_factory: Callable[..., RunningDaemon], notify_socket: NotifySocket
) -> None:
    """A stopped worker answers no ping: WATCHDOG=1 stops until it answers again."""
    env = {"NOTIFY_SOCKET": str(notify_socket.path), "WATCHDOG_USEC": "1000000"}
    daemon = daemon_factory(env=env)
    notify_socket.wait_for(lambda m: m == {"WATCHDOG": "1"}, timeout_s=10)
    warm = daemon.events("worker.warm")[0]
    worker_pid = warm["pid"]
    since_the_stop = daemon.trace_from_now()
    os.kill(worker_pid, signal.SIGSTOP)
    try:
        # A ping in flight when it stopped may still have been answered, its WATCHDOG=1
        # sent: once a tick has found the worker silent, any such one was sent before.
        unresponsive = since_the_stop.wait_for_event(
            lambda e: e.get("event") == "daemon.workers_unresponsive", timeout_s=5
        )
        notify_socket.drain()
        time.sleep(1.5)
        assert {"WATCHDOG": "1"} not in notify_socket.messages()
    finally:
        os.kill(worker_pid, signal.SIGCONT)
    assert unresponsive["devices"] == [warm["device"]]
    notify_socket.wait_for(lambda m: m == {"WATCHDOG": "1"}, timeout_s=5)


def test_daemon_serves_on_the_socket_systemd_passes(daemon_home: Path) -> None:
    """Socket activation (systemd-socket-activate): the first connect starts the daemon on fd 3."""
    tool = "/usr/bin/systemd-socket-activate"
    if not Path(tool).exists():
        pytest.skip("systemd-socket-activate is missing")
    settings, config = write_pair(daemon_home / "activated", CPU_SETTINGS, CPU_CONFIG)
    sock = daemon_home / "activated/s.sock"
    command = [
        tool, "--listen", str(sock), sys.executable, "-m", "taogpud",
        "--settings", str(settings), "--config", str(config),
        "--socket", str(daemon_home / "activated/unused.sock"),
        "--state-dir", str(daemon_home / "activated/state"),
    ]  # fmt: skip
    log = (daemon_home / "activated/out.log").open("wb")
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        with Client(sock, timeout_s=60) as client:
            assert client.health()["ok"] is True  # waited in the backlog while workers warmed
    finally:
        proc.terminate()
        proc.wait(30)
        log.close()
    assert not (daemon_home / "activated/unused.sock").exists()  # it bound nothing itself
    assert sock.exists()  # and left the file to whoever made it


# --- the journal ------------------------------------------------------------------------


def parse_native(datagram: bytes) -> dict[str, bytes]:
    """The journal's native protocol, read back."""
    fields: dict[str, bytes] = {}
    rest = datagram
    while rest:
        line, _, after = rest.partition(b"\n")
        if b"=" in line:
            name, _, value = line.partition(b"=")
            fields[name.decode()] = value
            rest = after
        else:
            (size,) = struct.unpack("<Q", after[:8])
            fields[line.decode()] = after[8 : 8 + size]
            rest = after[8 + size + 1 :]
    return fields


def test_native_protocol_encodes_newlines_as_binary_fields() -> None:
    """A value with a newline goes as NAME, newline, 64-bit LE length, bytes; others NAME=value."""
    encoded = journal.encode({"MESSAGE": "two\nlines", "JOB_ID": "j1"})
    assert encoded == b"MESSAGE\n" + struct.pack("<Q", 9) + b"two\nlines\nJOB_ID=j1\n"
    assert parse_native(encoded) == {"MESSAGE": b"two\nlines", "JOB_ID": b"j1"}


def test_field_names_and_values() -> None:
    """Keys become upper-case journal names; None is left out; booleans read as in JSON."""
    fields = journal.entry_fields(
        b"{}",
        {
            "event": "job.succeeded",
            "level": "warning",
            "timestamp": "t",
            "job_id": "j1",
            "fallback": True,
            "device_uuid": None,
            "run_ms": 1.5,
            "_private": "x",
            "h2d-ms": 2,
        },
    )
    assert fields == {
        "MESSAGE": "job j1 succeeded in 2 ms, a CPU fallback",
        "TRACE_JSON": b"{}",
        "PRIORITY": "4",
        "SYSLOG_IDENTIFIER": "taogpud",
        "EVENT": "job.succeeded",
        "JOB_ID": "j1",
        "FALLBACK": "true",
        "RUN_MS": "1.5",
        "PRIVATE": "x",
        "H2D_MS": "2",
    }


def test_the_journal_message_reads_as_a_human_log() -> None:
    """`journalctl -u taogpud` reads one short human line per event (it showed 300-character
    JSON); the data stays in the fields beside it, the whole JSON line in TRACE_JSON."""
    job = {"job_id": "1a2b3c4d5e6f70809", "task": "vector_add", "backend": "cuda"}
    done = {**job, "event": "job.succeeded", "device": "gpu:0", "run_ms": 31.4, "queue_ms": 0.2}
    fields = journal.entry_fields(b'{"event":"job.succeeded"}', done)
    assert fields["MESSAGE"] == "job 1a2b3c succeeded vector_add on gpu:0 (cuda) in 31 ms"
    assert fields["TRACE_JSON"] == b'{"event":"job.succeeded"}'
    assert fields["JOB_ID"] == "1a2b3c4d5e6f70809" and fields["RUN_MS"] == "31.4"
    messages = {
        "job.queued": {**job, "backend": None, "priority": 5},
        "job.failed": {**job, "device": "gpu:0", "error_code": "oom", "error": "out of memory"},
        "job.succeeded": {**job, "device": "cpu:0", "backend": "cpu", "run_ms": 2.0,
                          "fallback": True, "fallback_reason": "no driver"},
        "relay.request": {"method": "POST", "path": "/v1/chat/completions", "status": 200,
                          "model": "claude-sonnet", "total_ms": 212.4, "uid": 1000,
                          "tool": "codex"},
    }  # fmt: skip
    said = {
        event: journal.human_message({"event": event, **fields})
        for event, fields in messages.items()
    }
    assert said == {
        "job.queued": "job 1a2b3c queued vector_add (priority 5)",
        "job.failed": "job 1a2b3c failed vector_add on gpu:0 (cuda): oom: out of memory",
        "job.succeeded": "job 1a2b3c succeeded vector_add on cpu:0 (cpu) in 2 ms, "
        "a CPU fallback: no driver",
        "relay.request": "relay POST /v1/chat/completions 200 claude-sonnet in 212 ms "
        "(uid 1000, codex)",
    }
    assert all(len(line) < 160 and "{" not in line for line in said.values())


def test_journal_only_when_stdout_is_the_journal_stream(tmp_path: Path) -> None:
    """JOURNAL_STREAM must name stdout's device and inode; otherwise nothing is sent natively."""
    stat = os.fstat(sys.stdout.fileno())
    assert journal.stdout_is_journal({"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"})
    assert not journal.stdout_is_journal({"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino + 1}"})
    assert not journal.stdout_is_journal({})
    assert journal.open_writer({}) is None
    streamed = {"JOURNAL_STREAM": f"{stat.st_dev}:{stat.st_ino}"}
    assert journal.open_writer(streamed, path=str(tmp_path / "none")) is None


@pytest.fixture
def journald(daemon_home: Path) -> Iterator[NotifySocket]:
    """A stand-in journald, plugged into the logging set-up as it is under systemd."""
    stand_in = NotifySocket(daemon_home / "journal")
    tlog.set_secrets(SECRET)
    tlog._state.journal = journal.JournalWriter(str(stand_in.path))
    yield stand_in
    tlog._state.journal.close()
    tlog._state.journal = None
    tlog.set_secrets(None)
    stand_in.sock.close()


def _through_the_chain(event: str, **fields: Any) -> bytes | None:
    """The configured processors after the level filter, as structlog runs them."""
    event_dict: Any = {"event": event, "level": "info", **fields}
    try:
        event_dict = tlog.redact(None, "info", event_dict)
        return tlog.render(None, "info", event_dict)
    except structlog.DropEvent:
        return None


def test_job_event_goes_to_the_journal_once_and_redacted(journald: NotifySocket) -> None:
    """A job event is one native entry (MESSAGE a human line, TRACE_JSON the JSON line), with
    the key redacted in both."""
    line = _through_the_chain(
        "job.failed", job_id="j1", backend="cpu", error=f"bad key {SECRET}", api_key=SECRET
    )
    assert line is None  # not written to stdout as well
    [datagram] = journald.drain()
    assert SECRET.encode() not in datagram
    fields = parse_native(datagram)
    assert fields["JOB_ID"] == b"j1" and fields["BACKEND"] == b"cpu"
    assert fields["API_KEY"] == b"<redacted>"
    assert json.loads(fields["TRACE_JSON"])["error"] == "bad key <redacted>"
    assert fields["MESSAGE"] == b"job j1 failed on cpu: bad key <redacted>"


def test_other_events_and_failed_sends_stay_on_stdout(
    journald: NotifySocket, daemon_home: Path
) -> None:
    """Only job.* events go natively; when a send fails the line goes to stdout, not lost."""
    assert _through_the_chain("daemon.ready", backend="cpu") is not None
    assert journald.drain() == []
    assert tlog._state.journal is not None
    tlog._state.journal.path = str(daemon_home / "gone")
    line = _through_the_chain("job.succeeded", job_id="j2")
    assert line is not None and json.loads(line)["job_id"] == "j2"


def test_redaction_runs_before_rendering_in_the_configured_chain() -> None:
    """configure() puts `redact` before `render`, so the journal path sees redacted events."""
    tlog.configure()
    processors = structlog.get_config()["processors"]
    assert processors.index(tlog.redact) < processors.index(tlog.render) == len(processors) - 1


def test_deferred_lines_follow_the_loops_callback_in_order_with_their_own_time(
    journald: NotifySocket, capsys: pytest.CaptureFixture[str]
) -> None:
    """trace.deferred holds a line past the callback that made it (so a job's answer leaves
    first) for FLUSH_AFTER_S, then sends it the configured way: job events to the journal,
    redacted, the rest to stdout; the timestamp is when it was deferred, not when it was
    written."""
    tlog.configure()
    trace.flush()  # lines another test's loop left pending go out before the capture
    capsys.readouterr()
    tlog._state.journal = journal.JournalWriter(str(journald.path))
    held: dict[str, Any] = {}

    async def one_callback_then_the_next() -> None:
        deferred_at = time.time()
        trace.deferred("info", "job.succeeded", job_id="j3", error=f"bad key {SECRET}")
        trace.deferred("info", "api.request", path="/v1/jobs", status=201)
        time.sleep(0.2)  # still this callback: nothing may have been written
        held["journal"], held["stdout"] = journald.drain(), capsys.readouterr().out
        held["deferred_at"] = deferred_at
        await asyncio.sleep(trace.FLUSH_AFTER_S * 5)  # the deferred lines' timer writes them

    asyncio.run(one_callback_then_the_next())
    assert held["journal"] == [] and held["stdout"] == ""
    [datagram] = journald.drain()
    assert SECRET.encode() not in datagram and parse_native(datagram)["JOB_ID"] == b"j3"
    [line] = capsys.readouterr().out.splitlines()
    request = json.loads(line)
    assert (request["event"], request["status"]) == ("api.request", 201)
    written = calendar.timegm(time.strptime(request["timestamp"][:19], "%Y-%m-%dT%H:%M:%S"))
    written += float("0." + request["timestamp"][20:26])
    assert abs(written - held["deferred_at"]) < 0.1  # not 0.2 s later, when it was written


# --- what the packaged service leaves and says -------------------------------------------


def _tracker_of(pid: int) -> int:
    """The resource tracker multiprocessing started for `pid`: one of its children."""
    for task in Path(f"/proc/{pid}/task").glob("*"):
        for child in (task / "children").read_text().split():
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
            if b"multiprocessing.resource_tracker" in cmdline:
                return int(child)
    raise AssertionError(f"no resource tracker among the children of {pid}")


def _alive(pid: int, mark: bytes) -> bool:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return mark in cmdline and "State:\tZ" not in status


def test_stop_ends_the_resource_tracker_before_the_daemon_exits(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """The daemon's stop ends multiprocessing's resource tracker itself. Held stopped
    (SIGSTOP), the tracker cannot leave on its own when the daemon's pipe closes: it is
    gone after the stop only if the daemon ended it, as systemd would otherwise have to."""
    daemon = daemon_factory()
    tracker = _tracker_of(daemon.proc.pid)
    os.kill(tracker, signal.SIGSTOP)
    try:
        assert daemon.stop() == 0
        assert not _alive(tracker, b"multiprocessing.resource_tracker")
    finally:
        if _alive(tracker, b"multiprocessing.resource_tracker"):
            os.kill(tracker, signal.SIGKILL)


def test_hints_name_what_works_in_a_package(tmp_path: Path) -> None:
    """In a package's venv (its marker file) no hint says pip: the CUDA build or the CPU pair."""
    from taogpud.host.install_hints import CPU_PAIR, PACKAGE_MARKER, install_hint

    assert "pip install 'taogpud[cuda12]'" in install_hint("cuda", tmp_path)
    (tmp_path / PACKAGE_MARKER).write_text("extras=\n")
    for part in ("cuda", "nvml", "opencl", "nvrtc"):
        assert "pip" not in install_hint(part, tmp_path), part
    assert "CUDA build of the package" in install_hint("cuda", tmp_path)
    assert CPU_PAIR in install_hint("cuda", tmp_path)


@pytest.mark.parametrize(
    ("target", "extras", "lock"),
    [
        ("deb", "EXTRAS=", "cpu"),
        ("deb", "EXTRAS=cuda12", "cuda12"),
        ("demo", "DEMO_EXTRAS=", "cpu"),
    ],
)
def test_make_installs_only_the_locked_closure(
    tmp_path: Path, target: str, extras: str, lock: str
) -> None:
    """`make deb` and `make demo` install taogpud's runtime closure from its lock file with
    --require-hashes, then taogpud itself with nothing fetched: never the development venv's
    extras, never an unpinned version from the index."""
    root = Path(__file__).resolve().parent.parent
    done = subprocess.run(
        ["make", "-n", "-B", "-C", str(root), target, extras, f"VENV={tmp_path}/venv",
         f"DEMO_VENV={tmp_path}/demo"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    installs = [line for line in done.stdout.splitlines() if "pip install" in line]
    assert len(installs) == 2, done.stdout
    locked, own = installs
    assert f"--require-hashes --no-deps -r packaging/locks/{lock}.txt" in locked, locked
    assert "--no-deps --no-build-isolation --no-index ." in own, own
    assert all("dev" not in line for line in installs), installs
