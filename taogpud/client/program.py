"""Run your own program under a lease: queue it, wait for the lease, start it here, as you,
with the lease's environment, report its pid and, once it is gone, how it ended.

    with Client() as client:
        run = ProgramRun(client, ["python3", "train.py"], gpus=1)
        outcome = run.run()            # queued → granted → started → exited
        outcome.exit_status            # the program's, as a shell gives it (128+N: signal N)

The daemon never starts it and holds no privilege over it (docs/programs.md): this process
is its parent, stops it when the daemon asks (a cancel, a timeout: SIGTERM to its process
group, SIGKILL after the grace), and forwards what `interrupt()` is given (Ctrl-C). A start
it reports after its lease was revoked (a cancel, a timeout that came first) is refused
(409 lease_revoked): it kills the program's group at once and ends with the job. With
`reap_descendants` it becomes their subreaper (prctl PR_SET_CHILD_SUBREAPER), so the lease
ends only once the program's children are gone too.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, BinaryIO, NamedTuple, TypeVar

from taogpud.client import Client, Job
from taogpud.errors import ApiError, DaemonUnreachable, LeaseRevoked
from taogpud.wire import LeaseJson

STOP_GRACE_S = 5.0  # SIGTERM, then SIGKILL after this long
LEASE_POLL_S = 30.0  # one long-poll of the lease
RECONNECT_S = 300.0  # how long a starter tries to reach a restarting daemon before it gives up
RETRY_PAUSE_S = 0.2
FOLLOW_AFTER_S = 0.1  # a program running this long has its lease followed (ProgramRun._wait)
# A program ended this soon after its start is reported once, its start with its end
# (_report_at_once): `true` under 8 submitters on a host at load 16 ended within 0.02 ms at
# the median, 6.5 ms at p99. Its start is told that much later at most, about what one
# request takes on such a host.
REPORT_WITHIN_S = 0.01
PR_SET_CHILD_SUBREAPER = 36  # <linux/prctl.h>
OnQueued = Callable[[LeaseJson], None]
T = TypeVar("T")


class Outcome(NamedTuple):
    # the record as it ended; {id, status: "unknown"} when its end could not be reported
    job: Job | dict[str, Any]
    exit_status: int  # the program's exit status; 128+N if killed by signal N


class ProgramRun:
    """One program, from its submit to its report; `interrupt` may come from a signal
    handler while `run` waits."""

    def __init__(
        self,
        client: Client,
        argv: list[str],
        *,
        reap_descendants: bool = False,
        on_queued: OnQueued | None = None,
        output: BinaryIO | None = None,
        on_output: Callable[[bytes], None] | None = None,
        follow_after_s: float = FOLLOW_AFTER_S,
        report_within_s: float = REPORT_WITHIN_S,
        **request: Any,
    ) -> None:
        """output: where the program's stdout and stderr go, its stdin then /dev/null (a
        starter whose own stdio is a protocol: `taogpuctl mcp`); on_output: the same, in
        pieces to this callable (`exec --detach`'s supervisor ships them as the job's log);
        neither: this process's own stdout and stderr, live."""
        self.client = client
        self.argv = list(argv)
        self.request = request  # submit_program's keywords: gpus, device, mem_bytes, share, …
        self.reap_descendants = reap_descendants
        self.follow_after_s = follow_after_s  # when its lease starts being followed (_wait)
        self.report_within_s = report_within_s  # ended this soon: one report (_report_at_once)
        self.on_queued = on_queued
        self.output = output
        self.on_output = on_output
        self.job: Job | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self.cancelled = False  # it was interrupted here (Ctrl-C): the job ends cancelled

    def run(self) -> Outcome:
        return self.follow(self.submit())

    def submit(self) -> Job:
        """Queue the program; `follow` then waits for its lease, runs it and reports."""
        self.job = self.client.submit_program(self.argv, **self.request)
        return self.job

    def follow(self, job: Job) -> Outcome:
        lease = self._wait_for_lease(job)
        if lease["phase"] != "granted":  # cancelled while it waited, or told to stop already
            return Outcome(lease["job"], 1)
        return self._run_granted(lease["job"])

    def interrupt(self, signum: int) -> None:
        """Forward `signum` to the program's process group; the job will end cancelled."""
        self.cancelled = True
        if self.process is not None:
            _signal_group(self.process.pid, signum)

    def _wait_for_lease(self, job: Job) -> LeaseJson:
        job_id = job["id"]
        if job["status"] == "running" and not lease_of(job)["stop"]:  # granted at its submit
            return {"phase": "granted", "queue_position": None, "job": job}
        lease = _retrying(lambda: self.client.lease(job_id))
        while lease["phase"] == "queued":
            if self.on_queued is not None:
                self.on_queued(lease)
            lease = _retrying(
                lambda: self.client.lease(job_id, after="queued", wait_s=LEASE_POLL_S)
            )
        return lease

    def _run_granted(self, job: Job) -> Outcome:
        job_id, env = job["id"], _environment(lease_of(job)["env"])
        if self.reap_descendants:
            _become_subreaper()
        try:
            piped = self.on_output is not None
            self.process = _start(self.argv, env, job["params"]["cwd"], self.output, piped=piped)
        except OSError as exc:
            why = f"cannot run {self.argv[0]!r}: {exc.strerror or exc}"
            return Outcome(self.client.program_exited(job_id, not_started=why), 127)
        pid = self.process.pid
        reader = self._read_output()
        if not self.reap_descendants and _ended_within(pid, self.report_within_s):
            return self._report_at_once(job_id, self.process, reader)
        try:
            _retrying(lambda: self.client.program_started(job_id, pid))
        except ApiError as exc:
            return self._refused(job_id, exc, reader)
        returncode, stopper = self._wait(job_id, self.process)
        if self.reap_descendants:
            if stopper is None and _children_left():  # a stop must reach what runs on
                stopper = self._follow(job_id, self.process)
            _reap_orphans()
        if reader is not None:
            reader.join()  # every descendant gone: the pipe has ended
        return self._report(job_id, returncode, stopper)

    def _report_at_once(
        self, job_id: str, process: subprocess.Popen[bytes], reader: threading.Thread | None
    ) -> Outcome:
        """A program that ended within `report_within_s`: one report, its pid with its exit
        status (one request instead of two). It is left a zombie until the daemon has
        checked that pid as POST …/started would (the caller's own descendant, its start
        time), then reaped."""
        returncode = _returncode_unreaped(process.pid)
        if reader is not None:
            reader.join()  # its output is shipped before its end is told
        try:
            outcome = self._report(job_id, returncode, None, pid=process.pid)
        except ApiError as exc:
            return self._refused(job_id, exc, reader)
        process.wait()
        return outcome

    def _refused(self, job_id: str, refusal: ApiError, reader: threading.Thread | None) -> Outcome:
        """Its start refused as its lease was revoked (the job ended before the start was
        told): the program is killed with its group, at once, and reaped; the outcome is the
        job as it ended, and 1, as for a program cancelled before it started (`follow`)."""
        if refusal.code != LeaseRevoked.code:
            raise refusal
        assert self.process is not None
        _signal_group(self.process.pid, signal.SIGKILL)
        self.process.wait()
        if self.reap_descendants:
            _reap_orphans()
        if reader is not None:
            reader.join()  # every descendant gone: the pipe has ended
        return Outcome(_retrying(lambda: self.client.get(job_id)), 1)

    def _wait(self, job_id: str, process: subprocess.Popen[bytes]) -> tuple[int, Stopper | None]:
        """The program's return code. Its lease is followed (Stopper) once it has run
        `follow_after_s`: one that ends sooner costs no second connection, thread and
        long-poll (with 8 submitters, a third of the daemon's requests); a stop asked for
        meanwhile is what the Stopper's first look finds, so it comes that much later."""
        if _ended_within(process.pid, self.follow_after_s):
            return process.wait(), None
        stopper = self._follow(job_id, process)
        return process.wait(), stopper

    def _follow(self, job_id: str, process: subprocess.Popen[bytes]) -> Stopper:
        stopper = Stopper(self.client.socket_path, job_id, process)
        stopper.start()
        return stopper

    def _read_output(self) -> threading.Thread | None:
        """The program's output to `on_output`, piece by piece, on a thread of its own."""
        if self.on_output is None or self.process is None or self.process.stdout is None:
            return None
        pipe, sink = self.process.stdout, self.on_output

        def pump() -> None:
            while piece := os.read(pipe.fileno(), 1 << 16):
                sink(piece)

        reader = threading.Thread(target=pump, name="taogpud-program-output", daemon=True)
        reader.start()
        return reader

    def _report(
        self, job_id: str, returncode: int, stopper: Stopper | None, pid: int | None = None
    ) -> Outcome:
        how: dict[str, Any] = {"cancelled": self.cancelled}
        if pid is not None:
            how["pid"] = pid
        if returncode < 0:
            how["signal"] = signal.Signals(-returncode).name
        else:
            how["exit_code"] = returncode
        status = 128 - returncode if returncode < 0 else returncode
        if stopper is not None:
            stopper.finished.set()  # the program and its descendants are gone
        try:  # a daemon restarting meanwhile adopts the lease: the report waits for it
            job = _retrying(lambda: self.client.program_exited(job_id, **how))
        except DaemonUnreachable as exc:  # the program ran; its status is still the caller's
            print(f"taogpuctl: could not report the exit: {exc.message}", file=sys.stderr)
            ended: Job | dict[str, Any] = {"id": job_id, "status": "unknown"}
        else:
            ended = job
        if stopper is not None:
            stopper.join(timeout=1.0)  # its long-poll ends as the job does
        return Outcome(ended, status)


def lease_of(job: Job) -> dict[str, Any]:
    """A program job's lease (taogpud.jobs.records.ProgramView); every such job has one."""
    lease = job["program"]
    if lease is None:
        raise ApiError("not_a_program", f"job {job['id']} is a {job['task']} job, not a program")
    return lease


class Stopper(threading.Thread):
    """Follows the lease while the program runs (a connection of its own): told to stop (a
    cancel, a timeout), it sends SIGTERM to the program's group, SIGKILL after the grace."""

    def __init__(self, socket_path: str, job_id: str, process: subprocess.Popen[bytes]) -> None:
        super().__init__(name=f"taogpud-lease-{job_id}", daemon=True)
        self.socket_path, self.job_id, self.process = socket_path, job_id, process
        self.finished = threading.Event()  # set once the program and its descendants are gone

    def run(self) -> None:
        with contextlib.suppress(ApiError, DaemonUnreachable), Client(self.socket_path) as client:
            phase = "granted"
            while phase == "granted" and not self.finished.is_set():
                phase = self._next_phase(client)
            if phase == "stopping":
                self._stop()

    def _next_phase(self, client: Client) -> str:
        """The lease's next phase; through a daemon restart, "granted" again meanwhile."""
        try:
            return str(client.lease(self.job_id, after="granted", wait_s=LEASE_POLL_S)["phase"])
        except DaemonUnreachable:
            time.sleep(RETRY_PAUSE_S)
            return "granted"

    def _stop(self) -> None:
        _signal_group(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            _signal_group(self.process.pid, signal.SIGKILL)


def _ended_within(pid: int, seconds: float) -> bool:
    """Whether process `pid` (our child, not yet waited for) ends within `seconds`: its
    pidfd turns readable as it exits, no polling."""
    try:
        fd = os.pidfd_open(pid)
    except OSError:  # gone already (or no pidfds): let wait() say
        return True
    try:
        readable, _, _ = select.select([fd], [], [], seconds)
    finally:
        os.close(fd)
    return bool(readable)


def _returncode_unreaped(pid: int) -> int:
    """An ended child's return code as Popen gives it (-N: killed by signal N), leaving it
    a zombie (WNOWAIT): its pid stays its own until it is reaped."""
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)
    assert info is not None  # WEXITED without WNOHANG waits until it has ended
    return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status


def _children_left() -> bool:
    """Whether this process has children still (the orphans of a program it reaps)."""
    try:
        os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def _retrying(call: Callable[[], T]) -> T:
    """`call`, again while the daemon cannot be reached (a restart), for RECONNECT_S."""
    deadline = time.monotonic() + RECONNECT_S
    while True:
        try:
            return call()
        except DaemonUnreachable:
            if time.monotonic() >= deadline:
                raise
            time.sleep(RETRY_PAUSE_S)


def _environment(lease: dict[str, str]) -> dict[bytes, bytes]:
    """This process's environment with the lease's on top, in bytes, as exec takes it: read
    from os.environb, it is not decoded into str and encoded back a variable at a time (with
    ~100 variables that was 45% of a short program's CPU in its starter, under cProfile)."""
    env = dict(os.environb)
    env.update((os.fsencode(name), os.fsencode(value)) for name, value in lease.items())
    return env


def _start(
    argv: list[str], env: dict[bytes, bytes], cwd: str, output: BinaryIO | None, *, piped: bool
) -> subprocess.Popen[bytes]:
    """The program in a process group of its own (its children get what it gets); a
    terminal's input stays with the terminal's foreground group, so it reads /dev/null then.
    With `output`, or `piped` (one pipe, read by _read_output), its stdout and stderr go
    there together and its stdin is /dev/null."""
    if output is not None or piped:
        return subprocess.Popen(
            argv,
            env=env,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE if piped else output,
            stderr=subprocess.STDOUT,
            process_group=0,
        )
    stdin = subprocess.DEVNULL if os.isatty(0) else None
    return subprocess.Popen(argv, env=env, cwd=cwd, stdin=stdin, process_group=0)


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@contextlib.contextmanager
def forwarding(run: ProgramRun) -> Iterator[None]:
    """While the program runs, these signals go to it (and end the job cancelled); before,
    each is a KeyboardInterrupt (the caller cancels the queued job)."""
    previous = {signum: signal.getsignal(signum) for signum in FORWARDED}

    def forward(signum: int, _frame: Any) -> None:
        if run.process is None:
            raise KeyboardInterrupt
        run.interrupt(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def _become_subreaper() -> None:
    """Orphaned descendants of the program come to this process, which waits for them."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def _reap_orphans() -> None:
    """Wait until every descendant left behind by the program has exited."""
    while True:
        try:
            os.wait()
        except ChildProcessError:
            return
        except InterruptedError:
            continue
