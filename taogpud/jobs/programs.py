"""Programs: a user's own process under a lease (docs/programs.md), the second kind of job.

The scheduler queues and places a program like any job; what is a program's own is here:
its lease (the client that asked, the devices it holds, the process it runs), what NVML
proves of it (taogpud.programs.proof), its detached log (taogpud.programs.logs), its stop,
its end and its recovery after a restart. It changes job states only through the scheduler
(Jobs, the narrow side the scheduler hands it), so the state machine stays in one place.

It lives under jobs/, not programs/: it is scheduling, and speaks the scheduler's records
and states; taogpud/programs/ keeps the mechanisms it uses (/proc and pidfds, the lease's
environment, the proof, the log files), which import nothing of the jobs.
"""

from __future__ import annotations

import asyncio
import functools
import signal
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from taogpud.errors import Conflict, LeaseRevoked, NotPermitted, RequestError
from taogpud.jobs.access import check_access
from taogpud.jobs.policy import CANCEL_GRACE_S, REVOKE_GRACE_S, Policy
from taogpud.jobs.records import (
    PROGRAM_TASK,
    JobErrorView,
    JobRecord,
    JobState,
    Peer,
    ProgramView,
    new_job_id,
)
from taogpud.jobs.store import JobStore, Tell
from taogpud.observability import trace
from taogpud.observability.nvml import GpuDevice, Xid
from taogpud.pool.interface import Worker
from taogpud.programs import leases, proof
from taogpud.programs.logs import ProgramLogs
from taogpud.wire import ProgramRequest


class Jobs(NamedTuple):
    """The scheduler as the programs' part sees it, handed over when it is made."""

    store: JobStore
    policy: Callable[[], Policy]  # the policy now (a reload swaps it)
    get: Callable[[str], JobRecord]  # raises JobNotFound
    move: Callable[[JobRecord, JobState], bool]  # the one place a job's status changes
    finish: Callable[[JobRecord, JobState, JobErrorView | None], None]
    trace: Callable[[JobRecord], None]  # the job's trace line, once committed
    dispatch: Callable[[], None]  # start what can run now (after a lease ends)
    run: Callable[[JobRecord], None]  # a granted lease counts as running; its timeout armed
    stopped: Callable[[str, bool], None]  # a lease ended: (job id, whether it was counted)


@dataclass
class Lease:
    """An unfinished program's bookkeeping: its client while it waits, then the devices it
    holds and its process. Its record (JobRecord.program) is what the store keeps."""

    client: tuple[int, int] | None = None  # the process that asked (pid, start): followed
    program: leases.Watch | None = None  # the program, once its starter reported it
    indexes: list[int] = field(default_factory=list)  # the devices held (empty while queued)
    reserved: list[int] = field(default_factory=list)  # bytes reserved on each
    whole: bool = True  # every slot of its devices (no --share)
    client_gone: bool = False
    proof: proof.ProgramProof | None = None  # what NVML saw (a CUDA lease), once started
    revoked: bool = False  # stopped before its start was reported: its job ended (Programs.stop)
    grace: asyncio.TimerHandle | None = None  # a revoked lease's devices back at the latest

    def close(self) -> None:
        if self.program is not None:
            self.program.close()
        if self.grace is not None:
            self.grace.cancel()


class Held(NamedTuple):
    """What the programs' leases hold of one device."""

    running: int = 0
    whole: bool = False
    bytes: int = 0


class Programs:
    def __init__(self, jobs: Jobs, logs: ProgramLogs) -> None:
        self.jobs = jobs
        self.logs = logs  # detached programs' output
        self.granted = 0  # programs holding devices now (counted as running by the scheduler)
        self.verdicts: Counter[str] = Counter()  # proof.Verdict codes given, by code
        self._leases: dict[str, Lease] = {}  # every unfinished program: its lease, processes
        self._revoked: dict[str, Lease] = {}  # ended unstarted, devices held still (stop)
        self._stop_reason: dict[str, JobState] = {}  # running program → cancelled | timed_out
        self._stop_errors: dict[str, JobErrorView] = {}  # a program stopped for what NVML saw
        self._clients = leases.Watches(self._client_gone)  # the leases' clients, each once
        self._lease_changes: dict[str, asyncio.Event] = {}  # set when a lease's phase changes
        self._log_growth: dict[str, asyncio.Event] = {}  # set when a log grows or its job ends

    def __contains__(self, job_id: str) -> bool:
        """Whether the job is an unfinished program (one with a lease)."""
        return job_id in self._leases

    # -- submit and grant -----------------------------------------------------------------

    def admit(self, request: ProgramRequest, peer: Peer, client: tuple[int, int]) -> JobRecord:
        """The program's record, stored; its client (the caller: pid, start time) followed
        from now: gone before its program starts, the job ends."""
        mem, policy = request.mem_bytes, self.jobs.policy()
        client_pid, client_start = client
        program = ProgramView(gpus=request.gpus, share=request.share, mem_bytes=mem)
        program.client_pid, program.client_start = client_pid, client_start
        job = JobRecord(
            id=new_job_id(),
            task=PROGRAM_TASK,
            params={"argv": request.argv, "cwd": request.cwd, "name": request.name},
            priority=request.priority,
            timeout_s=request.timeout_s or policy.job_timeout_s,
            affinity=request.affinity,
            requested_device=request.device,
            peer=peer,
            estimate_bytes=mem or 0,
            program=program,
        )
        self.jobs.store.add(job)
        self._leases[job.id] = Lease(self._follow_client(job.id, client_pid, client_start))
        return job

    def grant(self, job: JobRecord, workers: list[Worker]) -> None:
        """The lease: the devices are the program's from now, until it and its children end."""
        program, lease, now = job.program, self._leases[job.id], time.time()
        assert program is not None
        infos = [w.info for w in workers if w.info is not None]  # placed: every one is warm
        reserved = [program.mem_bytes or info.memory_cap_bytes for info in infos]
        granted = [leases.Granted(i.backend, i.device, i.uuid, w.spec.thread_num)
                   for i, w in zip(infos, workers, strict=True)]  # fmt: skip
        self.jobs.move(job, JobState.running)
        job.started_at, job.queue_ms = now, (now - job.created_at) * 1e3
        first = infos[0]
        job.backend, job.device, job.device_index = first.backend, _labels(infos), first.index
        job.device_uuid, job.compute_capability = first.uuid, first.compute_capability
        job.fallback_reason = workers[0].spec.fallback_reason
        job.fallback = job.fallback_reason is not None
        program.devices = [i.device for i in infos]
        program.device_indexes = [i.index for i in infos]
        program.device_uuids = [i.uuid for i in infos]
        program.reserved_bytes = reserved
        program.env = leases.lease_env(job.id, granted, reserved)
        program.deadline = now + job.timeout_s if job.timeout_s else None
        lease.indexes, lease.reserved, lease.whole = (
            program.device_indexes,
            reserved,
            not program.share,
        )
        self._hold(job)

    def _hold(self, job: JobRecord) -> None:
        """Count a granted lease (the scheduler arms its timeout)."""
        self.jobs.run(job)
        self.granted += 1
        self.jobs.store.save(job)
        self.jobs.trace(job)

    def held(self) -> dict[int, Held]:
        """What the granted leases hold, by device index."""
        held: dict[int, Held] = {}
        for lease in [*self._leases.values(), *self._revoked.values()]:
            for index, reserved in zip(lease.indexes, lease.reserved, strict=True):
                total = held.get(index, Held())
                held[index] = Held(
                    total.running + 1, total.whole or lease.whole, total.bytes + reserved
                )
        return held

    # -- what the lease's follower and the log's reader wait on ---------------------------

    def lease_phase(self, job: JobRecord) -> str:
        """queued, granted, stopping (its starter is told to stop it) or ended."""
        if job.status.finished:
            return "ended"
        if job.status is JobState.queued:
            return "queued"
        return "stopping" if job.program and job.program.stop else "granted"

    def lease_change(self, job_id: str) -> asyncio.Event:
        """An event set at the lease's next change of phase."""
        return self._lease_changes.setdefault(job_id, asyncio.Event())

    def changed(self, job_id: str) -> None:
        """The program's status changed (Scheduler._move), or its stop was asked."""
        for events in (self._lease_changes, self._log_growth):
            event = events.pop(job_id, None)
            if event is not None:
                event.set()

    def append_log(self, job_id: str, peer: Peer, data: bytes) -> None:
        """Output of a program (its starter sends it: `--detach`), kept up to the bound."""
        job, _ = self._granted_program(job_id, peer, "write the log of")
        program = job.program
        assert program is not None
        kept = self.logs.append(job_id, data, self.jobs.policy().program_log_bytes)
        program.log_bytes += kept
        program.log_dropped_bytes += len(data) - kept
        event = self._log_growth.pop(job_id, None)
        if event is not None:
            event.set()

    def log_growth(self, job_id: str) -> asyncio.Event:
        """An event set when the program's log next grows, or its job ends."""
        return self._log_growth.setdefault(job_id, asyncio.Event())

    # -- its starter's word ---------------------------------------------------------------

    def started(self, job_id: str, pid: int, peer: Peer, *, ended: bool = False) -> JobRecord:
        """The starter's word that the program runs as `pid`: checked to be the caller's own
        process (its uid) and its descendant, then followed until it ends (unless `ended`:
        its exit comes with this word, exited(), and there is no end left to follow)."""
        try:
            job, lease = self._granted_program(job_id, peer, "start the program of")
        except LeaseRevoked:
            self._give_back(job_id)  # its starter has answered: it kills what it started
            raise
        program = job.program
        assert program is not None
        if program.pid is not None:
            raise Conflict(
                f"job {job_id}'s program was started already (pid {program.pid})",
                "a program is started once: submit it again to run it again",
            )
        process = _callers_process(pid, peer)
        program.pid, program.pid_start = pid, process.start
        if not ended:
            lease.program = self._watch(job_id, pid, process.start)
        lease.proof = self._proof_for(job)
        self.jobs.store.save(job)
        said = {"job_id": job_id, "pid": pid, "devices": list(program.devices)}
        self.jobs.store.tell(trace.line("info", "program.started", said), Tell.TRACE, job_id)
        return job

    def _granted_program(self, job_id: str, peer: Peer, action: str) -> tuple[JobRecord, Lease]:
        job = self.jobs.get(job_id)
        check_access(job, peer, action)
        if job.program is not None and job.program.pid is None and job.status.finished:
            raise _revoked(job)
        lease = self._leases.get(job_id)
        if job.program is None or lease is None or job.status is not JobState.running:
            what = "a program" if job.program is not None else f"a {job.task} job, not a program"
            raise Conflict(
                f"job {job_id} is {what} and {job.status.value}: it holds no lease now",
                "wait for its lease (GET /v1/programs/{id}/lease) before starting it",
            )
        return job, lease

    def exited(self, job_id: str, peer: Peer, exit: ProgramExit) -> JobRecord:
        """The starter's word that the program (and every descendant) is gone: the job ends
        with its exit status and the lease is released. A second word is ignored. With a
        pid, the word of its start comes with it (a program that ended before its starter
        said it started: one request instead of two), checked as started() checks it."""
        job = self.jobs.get(job_id)
        check_access(job, peer, "report the exit of")
        if job.status.finished:
            return self._exited_after_end(job, exit)
        if exit.pid is not None and (job.program is None or job.program.pid != exit.pid):
            self.started(job_id, exit.pid, peer, ended=True)
        if job.program is None or job.status is not JobState.running:
            self._granted_program(job_id, peer, "report the exit of")  # raises Conflict
        job.result = {"exit_code": exit.exit_code, "signal": exit.signal}
        if job.started_at is not None:
            job.run_ms = (time.time() - job.started_at) * 1e3
        state = self._stop_reason.pop(job_id, None) or exit.state()
        self.jobs.finish(job, state, self._stop_errors.pop(job_id, None) or exit.error(state, job))
        self.jobs.dispatch()
        return job

    def _exited_after_end(self, job: JobRecord, exit: ProgramExit) -> JobRecord:
        """The word of a starter whose job has ended: a second one (a retry through a
        restart) is ignored; a start told with it after its lease was revoked is refused.
        Either way its starter has answered: a revoked lease's devices go back."""
        self._give_back(job.id)
        program = job.program
        if exit.pid is not None and program is not None and program.pid is None:
            raise _revoked(job)
        return job

    # -- its processes, followed ----------------------------------------------------------

    def _watch(self, job_id: str, pid: int, start: int) -> leases.Watch:
        """The program's process, followed until it ends."""
        return leases.Watch(pid, start, functools.partial(self._program_gone, job_id))

    def _follow_client(self, job_id: str, pid: int, start: int) -> tuple[int, int]:
        """The lease's client, followed (with its other leases: leases.Watches) until it
        exits or the lease ends (_release)."""
        self._clients.follow(pid, start, job_id)
        return pid, start

    def _client_gone(self, job_id: str) -> None:
        """The process that asked for the lease exited: a program it never started will not
        be; one it started runs on under its lease (it is the user's) until it ends. Its
        lease revoked already, it can start nothing there any more: the devices go back."""
        if job_id in self._revoked:
            self._give_back(job_id)
            return
        job, lease = self.jobs.store.get(job_id), self._leases.get(job_id)
        if job is None or lease is None or job.status.finished:
            return
        lease.client_gone = True
        program = job.program
        assert program is not None
        if lease.program is None:
            pid = program.client_pid
            message = f"its client (pid {pid}) exited before it started the program"
            self.jobs.finish(job, JobState.cancelled, _error("client_gone", message))
            self.jobs.dispatch()
        elif lease.program.ended:
            self._program_gone(job_id)
        else:
            trace.log.warning("program.unattended", job_id=job_id, pid=program.pid)
            if program.stop:
                self._signal_program(job_id, signal.SIGTERM)

    def _program_gone(self, job_id: str) -> None:
        """The program exited. Its starter, alive, reports its status once every descendant
        is gone too; with its starter gone, no one can: the job ends without one."""
        job, lease = self.jobs.store.get(job_id), self._leases.get(job_id)
        if job is None or lease is None or job.status.finished or not lease.client_gone:
            return
        state = self._stop_reason.pop(job_id, None) or JobState.interrupted
        message = "the program ended after its starter exited: its exit status is unknown"
        error = self._stop_errors.pop(job_id, None) or _error(state.value, message)
        self.jobs.finish(job, state, error)
        self.jobs.dispatch()

    # -- stop and end ---------------------------------------------------------------------

    def stop(self, job_id: str, reason: JobState) -> None:
        """Stop a granted program for `reason` (a cancel, a timeout, a verdict). Started (its
        pid reported), its starter is asked to stop it (SIGTERM, then SIGKILL after its
        grace); the daemon signals it itself only where its starter is gone and it may. Not
        started yet, its lease is revoked (_revoke): the job ends at once."""
        job, lease = self.jobs.store.get(job_id), self._leases.get(job_id)
        if job is None or job.program is None or lease is None or job.program.stop:
            return
        if job.program.pid is None and job.status is JobState.running:
            self._revoke(job, lease, reason)
            return
        self._stop_reason[job_id] = reason
        job.program.stop = reason.value
        self.jobs.store.save(job)
        self.changed(job_id)
        if lease.client_gone:
            self._signal_program(job_id, signal.SIGTERM)

    def _revoke(self, job: JobRecord, lease: Lease, reason: JobState) -> None:
        """End the job of a lease whose program was not reported started, for `reason`, now
        (its starter may be hung, or never start one). Its starter may yet have started the
        program in the instant before it heard: its report of that start is refused from
        now (LeaseRevoked), and it kills the program. So the devices stay held (end) until
        it can no longer start on them: it answered (that start or its exit refused, or it
        said it never started one), it exited (_client_gone), or REVOKE_GRACE_S passed. A
        device counted exclusive never gets a second program, but beside one whose starter
        hung past the grace, until that starter's report is refused."""
        program = job.program
        assert program is not None and job.started_at is not None
        program.stop, lease.revoked = reason.value, True
        job.run_ms = (time.time() - job.started_at) * 1e3
        self.jobs.finish(
            job, reason, self._stop_errors.pop(job.id, None) or _unstarted(job, reason)
        )

    def _signal_program(self, job_id: str, signum: int) -> None:
        lease = self._leases.get(job_id)
        if lease is None or lease.program is None or not lease.program.signal(signum):
            return
        if signum == signal.SIGTERM:
            loop = asyncio.get_running_loop()
            loop.call_later(CANCEL_GRACE_S, self._signal_program, job_id, signal.SIGKILL)

    def end(self, job: JobRecord) -> None:
        """A finished program's devices go back (its record keeps what it was given); those
        of a revoked lease once its starter can no longer start on them (_revoke)."""
        lease = self._leases.pop(job.id, None)
        if lease is None:
            return
        if lease.proof is not None:
            job.evidence = lease.proof.evidence()
        self._stop_reason.pop(job.id, None)
        self._stop_errors.pop(job.id, None)
        if lease.revoked and lease.indexes and not lease.client_gone:
            self._revoked[job.id] = lease
            lease.grace = asyncio.get_running_loop().call_later(
                REVOKE_GRACE_S, self._give_back, job.id
            )
        else:
            self._release(job.id, lease)

    def _give_back(self, job_id: str) -> None:
        """A revoked lease's starter can no longer start on its devices: they go back."""
        lease = self._revoked.pop(job_id, None)
        if lease is not None:
            self._release(job_id, lease)
            self.jobs.dispatch()

    def close(self) -> None:
        """The daemon stops: its pidfds are closed (a restart follows the processes again,
        recover), no lease ends for it."""
        self._clients.close()
        for lease in (*self._leases.values(), *self._revoked.values()):
            lease.close()

    def _release(self, job_id: str, lease: Lease) -> None:
        if lease.client is not None:
            self._clients.let_go(*lease.client, job_id)
        lease.close()
        if lease.indexes:
            self.granted -= 1
        self.jobs.stopped(job_id, bool(lease.indexes))

    # -- the proof (taogpud.programs.proof), from NVML samples ----------------------------

    def _proof_for(self, job: JobRecord) -> proof.ProgramProof | None:
        """A CUDA lease is watched through NVML; another backend has nothing to show."""
        program = job.program
        if program is None or job.backend != "cuda" or None in program.device_uuids:
            return None
        return proof.ProgramProof(
            uuids=tuple(u for u in program.device_uuids if u is not None),
            labels=tuple(program.devices),
            reserved_bytes=tuple(program.reserved_bytes),
            first_use_timeout_s=self.jobs.policy().first_use_timeout_s,
            started_s=time.monotonic(),
        )

    @property
    def watching(self) -> bool:
        """Whether a running program awaits NVML samples (observe)."""
        return any(lease.proof is not None for lease in self._leases.values())

    def observe(
        self, devices: Sequence[GpuDevice], now_s: float, xids: Sequence[Xid] | None = None
    ) -> None:
        """One NVML sample for every program under a CUDA lease: its evidence updated, and
        what it leads to done (a stop with the reason, or a flag). `xids`: those NVML
        reported since the last sample; None where it cannot (no XID section then)."""
        children = proof.children_now()
        for job_id, lease in list(self._leases.items()):
            job = self.jobs.store.get(job_id)
            if lease.proof is None or job is None or job.status is not JobState.running:
                continue
            pids = _program_pids(job, lease, children)
            for verdict in lease.proof.observe(devices, pids, now_s):
                self._act_on(job, verdict)
            if xids is not None:
                self._record_xids(job, lease.proof, xids, now_s)
            job.evidence = lease.proof.evidence()
            self.jobs.store.save(job)

    def _record_xids(
        self, job: JobRecord, watched: proof.ProgramProof, xids: Sequence[Xid], now_s: float
    ) -> None:
        """Each XID on its GPUs: a warning line now; its evidence keeps them all."""
        for xid in watched.record_xids(xids, now_s):
            trace.log.warning("program.xid", job_id=job.id, **xid)

    def _act_on(self, job: JobRecord, verdict: proof.Verdict) -> None:
        self.verdicts[verdict.code] += 1
        trace.log.warning("program." + verdict.code, job_id=job.id, message=verdict.message)
        flagged = verdict.code == "unassigned_gpu" or (
            verdict.code == "never_used_gpu" and self.jobs.policy().allow_fallback_to_cpu
        )
        if flagged:
            job.fallback = job.fallback or verdict.code == "never_used_gpu"
            job.fallback_reason = verdict.message if job.fallback else job.fallback_reason
            job.evidence = {**job.evidence, "flag": verdict.code}
            self.jobs.trace(job)
            return
        self._stop_errors[job.id] = _error(verdict.code, verdict.message, verdict.hint)
        self.stop(job.id, JobState.failed)

    # -- after a restart ------------------------------------------------------------------

    def recover(self, job: JobRecord) -> None:
        """A program a previous run accepted. Queued, it queues again while its client lives;
        granted, its lease is adopted while its program or its starter lives (pid and start
        time: a pid given again is not theirs), its devices held as before; else it ends."""
        program = job.program
        assert program is not None
        client_alive = leases.alive(program.client_pid, program.client_start)
        program_alive = leases.alive(program.pid, program.pid_start)
        if job.status is JobState.queued and client_alive:
            self._leases[job.id] = Lease(self._follow_client(job.id, *_client_of(job)))
            self.jobs.move(job, JobState.queued)
        elif job.status is JobState.running and (client_alive or program_alive):
            self._adopt(job, client_alive)
        else:
            self._leases[job.id] = Lease()
            self._end_unadopted(job)

    def _adopt(self, job: JobRecord, client_alive: bool) -> None:
        """Hold a running program's devices again, and follow its processes as before."""
        program = job.program
        assert program is not None
        lease = Lease(
            indexes=list(program.device_indexes),
            reserved=list(program.reserved_bytes),
            whole=not program.share,
            client_gone=not client_alive,
        )
        self._leases[job.id] = lease
        if client_alive:
            lease.client = self._follow_client(job.id, *_client_of(job))
        if program.pid is not None:  # gone already: its watch says so, its starter reports
            assert program.pid_start is not None
            lease.program = self._watch(job.id, program.pid, program.pid_start)
            lease.proof = self._proof_for(job)
        if program.stop:
            self._stop_reason[job.id] = JobState(program.stop)
        trace.log.info("program.adopted", job_id=job.id, pid=program.pid, devices=program.devices)
        self._hold(job)

    def _end_unadopted(self, job: JobRecord) -> None:
        if job.status is JobState.queued:
            message = "taogpud restarted and the program's client is gone"
            self.jobs.finish(job, JobState.cancelled, _error("client_gone", message))
        else:
            message = (
                "taogpud stopped while the program held its lease, and neither the program "
                "nor its starter runs any more: its exit status is unknown"
            )
            self.jobs.finish(job, JobState.interrupted, _error("interrupted", message))


class ProgramExit(NamedTuple):
    """How a program ended, as its starter saw it (it is the program's parent)."""

    exit_code: int | None  # None: killed by a signal, or never started
    signal: str | None = None  # "SIGKILL"
    cancelled: bool = False  # its starter stopped it (Ctrl-C in `taogpuctl exec`)
    not_started: str | None = None  # why it could not be started (exec failed)
    pid: int | None = None  # its start, reported with its end (Programs.exited)

    def state(self) -> JobState:
        if self.cancelled:
            return JobState.cancelled
        return (
            JobState.succeeded if self.exit_code == 0 and self.signal is None else JobState.failed
        )

    def error(self, state: JobState, job: JobRecord) -> JobErrorView | None:
        if state is JobState.succeeded:
            return None
        how = _how_it_ended(self)
        if self.not_started is not None:
            return _error("program_not_started", self.not_started, "check the command and its path")
        if state is JobState.failed:
            return _error("program_failed", f"the program {how}")
        if state is JobState.timed_out:
            return _error(
                "timed_out",
                f"the program ran past its timeout of {job.timeout_s} s and {how}",
                "raise --timeout",
            )
        return _error(state.value, f"{state.value}: the program {how}")


def caller(peer: Peer) -> tuple[int, int]:
    """The calling process (SO_PEERCRED): its pid and start time. A lease follows it."""
    start = None if peer.pid is None else leases.start_time(peer.pid)
    if peer.pid is None or start is None:
        raise RequestError(
            f"taogpud cannot see the calling process (pid {peer.pid}) in /proc",
            "submit programs from this host's own process namespace",
        )
    return peer.pid, start


def _error(code: str, message: str, hint: str = "") -> JobErrorView:
    return JobErrorView(code=code, message=message, hint=hint)


def _unstarted(job: JobRecord, reason: JobState) -> JobErrorView:
    """Why a lease revoked before its program was reported started ended (Programs._revoke)."""
    if reason is JobState.timed_out:
        message = f"the lease ran past its timeout of {job.timeout_s} s before its program started"
        return _error("timed_out", message, "raise --timeout, or check that its starter runs")
    return _error(reason.value, f"{reason.value} before its program was reported started")


def _revoked(job: JobRecord) -> LeaseRevoked:
    return LeaseRevoked(
        f"job {job.id} ended {job.status.value} before its program was reported started: its "
        "lease is revoked, and its devices are no longer the program's",
        "stop the program (taogpuctl and ProgramRun kill it themselves); submit it again",
    )


def _how_it_ended(exit: ProgramExit) -> str:
    if exit.signal is not None:
        return f"was killed by {exit.signal}"
    return f"exited with status {exit.exit_code}"


def _labels(infos: list[Any]) -> str:
    return ",".join(info.device for info in infos)


def _callers_process(pid: int, peer: Peer) -> leases.Process:
    """Process `pid`, checked to be the caller's: its uid, and a descendant of the caller."""
    process = leases.read_process(pid)
    if process is None:
        raise RequestError(f"there is no process {pid} (or it has ended)", "report a running pid")
    if process.uid != peer.uid:
        raise NotPermitted(
            f"process {pid} belongs to uid {process.uid}, not to the caller (uid {peer.uid})",
            "report the program your own process started",
        )
    if peer.pid is None or not leases.descends_from(process, peer.pid):
        raise NotPermitted(
            f"process {pid} is not a descendant of the caller (pid {peer.pid})",
            "report the program from the process that started it (or one of its parents)",
        )
    return process


def _client_of(job: JobRecord) -> tuple[int, int]:
    """The process that asked for the job's lease: its pid and start time."""
    program = job.program
    assert program is not None and program.client_pid is not None
    assert program.client_start is not None
    return program.client_pid, program.client_start


def _program_pids(job: JobRecord, lease: Lease, children: dict[int, list[int]]) -> set[int]:
    """The program's processes: its own tree, and the orphans its starter (their subreaper)
    took in, the starter itself apart."""
    program = job.program
    assert program is not None and program.pid is not None
    pids = proof.process_tree([program.pid], children)
    if not lease.client_gone and program.client_pid is not None:
        pids |= proof.process_tree([program.client_pid], children) - {program.client_pid}
    return pids
