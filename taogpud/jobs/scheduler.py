"""The coordinator of jobs: the one place a job's status changes (_move), and the steps
that change it: submit, dispatch, cancels and timeouts, the pool's results, retries,
recovery, the drain.

What it leans on is each in a module of its own: admission.py (may a job enter; nothing
changed there), runqueue.py (who waits, in the order they start; it follows the states),
placer.py (the workers as placement sees them, and what placement remembers; the decision
is placement.py's, pure), orders.py (a job's order to its worker, and the client memory a
job holds until it ends), programs.py (a program's lease, proof and log: it changes states
only through the Jobs callables handed to it here), and the store's one telling function,
JobStore.tell (commit before tell).
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import time
from collections import Counter
from pathlib import Path
from typing import Any

from taogpud.arrayfiles.store import ArrayStore
from taogpud.errors import JobNotFound, StateDiskFull
from taogpud.i18n import Text
from taogpud.jobs import admission, placement, programs
from taogpud.jobs.access import check_access
from taogpud.jobs.memory import JobRegions
from taogpud.jobs.orders import Orders
from taogpud.jobs.placer import Placer, wanted
from taogpud.jobs.policy import CANCEL_GRACE_S, Policy
from taogpud.jobs.programs import Jobs, Programs
from taogpud.jobs.records import (
    JobErrorView,
    JobRecord,
    JobState,
    OutputView,
    Peer,
    new_job_id,
)
from taogpud.jobs.runqueue import RunQueue
from taogpud.jobs.store import JobStore, Tell
from taogpud.jobs.trace_line import job_line
from taogpud.observability import metrics, trace
from taogpud.pool import protocol as msg
from taogpud.pool.interface import Pool, Worker
from taogpud.programs.logs import ProgramLogs
from taogpud.wire import JobRequest, ProgramRequest


class Scheduler:
    def __init__(
        self, policy: Policy, store: JobStore, arrays: ArrayStore, pool: Pool, outputs_dir: Path
    ) -> None:
        self.policy = policy
        self.store = store
        self.arrays = arrays
        self.pool = pool  # built first, not started: its start() names this scheduler its sink
        self.outputs_dir = outputs_dir  # kept outputs: <outputs_dir>/<job id>/<name>.npy
        self.accepting = True
        self.running_total = 0
        self.jobs_total = 0  # accepted since start
        self.finished_counts: Counter[tuple[str, str, str]] = Counter()  # (task, backend, status)
        self.job_times = metrics.JobTimes()  # queue and run time histograms
        # The run queue follows the job states: a job is in it exactly while its status is
        # queued, and only _move puts it there or takes it out (see _move). Read it; never
        # change it from outside.
        self.queue = RunQueue()
        self.placer = Placer(pool)  # the workers as placement sees them, and its memory
        self.orders = Orders(arrays, outputs_dir)  # to workers; client memory jobs hold
        self._withdrawn: dict[str, JobRecord] = {}  # running jobs whose submit was refused
        self._stop_reason: dict[str, JobState] = {}  # running job → cancelled | timed_out
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()  # set while no task job runs (drain waits for it)
        self._idle.set()
        # Programs (taogpud.jobs.programs): their leases, proof and logs; they change states
        # only through the callables handed to them here
        jobs = Jobs(
            store,
            lambda: self.policy,
            self.get,
            self._move,
            self._finish,
            self._trace,
            self.dispatch,
            self._run_lease,
            self._lease_ended,
        )
        self.programs = Programs(jobs, ProgramLogs(outputs_dir))

    @property
    def queued(self) -> int:
        return len(self.queue)

    # -- submit ---------------------------------------------------------------------------

    def submit(
        self, request: JobRequest, peer: Peer, regions: JobRegions | None = None
    ) -> JobRecord:
        """Admit a job (taogpud.jobs.admission); with `regions` (memfd/server.py) its inputs
        and outputs are in the client's own memory instead of the array store."""
        admission.check_open(self.accepting, self.store)
        task, validated, estimate = admission.check_job(
            request, peer, regions, self.policy, self.arrays, self.pool
        )
        devices = self._devices()  # one view for the admission and the placement below
        admission.check_room(request, estimate, devices, len(self.queue), self.policy)
        job_id, params = new_job_id(), validated.model_dump(mode="json")
        created_at = time.time()  # before its order's sent_at: queue_ms is never negative
        inputs = request.inputs if regions is None else {}
        if regions is not None:
            self.orders.hold(job_id, regions)
        placed = self._place_at_once(
            placement.Job(estimate, request.device, request.affinity), devices
        )
        worker = placed[0] if placed else None
        if worker is not None:  # its order leaves first: the worker runs while the job is made
            refs = self.orders.inputs(job_id, inputs)  # found by admission.check_job above
            sent_at = self.orders.send(
                worker, job_id, task.name, params, request.keep_outputs, refs
            )
        job = JobRecord(  # after the order: 26 µs of a tiny job's round trip (timeline marks)
            id=job_id,
            created_at=created_at,
            task=task.name,
            params=params,
            inputs=inputs,
            priority=request.priority,
            timeout_s=request.timeout_s or self.policy.job_timeout_s,
            affinity=request.affinity,
            requested_device=request.device,
            keep_outputs=request.keep_outputs,
            max_retries=request.max_retries,
            peer=peer,
            estimate_bytes=estimate,
            memory=None if regions is None else regions.record(),
        )
        self.store.add(job)
        self.jobs_total += 1
        self.arrays.pin(list(job.inputs.values()))
        self._trace(job)
        if worker is not None:
            self._mark_started(job, worker, sent_at)
        else:
            self._move(job, JobState.queued)
            self.dispatch()
        return job

    def commit(self, job_id: str) -> str:
        """A new job's record as committed, for its submit's answer (JobStore.tell).

        A commit the disk refuses (StateDiskFull) withdraws a job never written before it is
        raised: its submit is refused, never answered 201 for a job that a restart would not
        find. The other pending records stay pending."""
        job = self.get(job_id)
        try:
            return self.store.tell(
                lambda: self.store.written.get(job_id) or job.model_dump_json(),
                Tell.ACCEPTANCE,
                job_id,
            )
        except StateDiskFull:
            self._withdraw(job)
            raise

    def _withdraw(self, job: JobRecord) -> None:
        """Undo a submit that could not be committed: the job leaves the queue, or its worker
        is told to stop and its finish will be dropped; no record of it is kept."""
        self.store.discard(job.id)
        self.orders.let_go(job.id)  # the submitter releases the client memory it held
        self.jobs_total -= 1
        if job.status.finished:
            return  # its finish unpinned the inputs already
        self.arrays.unpin(list(job.inputs.values()))
        self.queue.remove(job.id)
        worker = self._worker_running(job.id)
        if worker is not None:
            self._withdrawn[job.id] = job
            worker.send(msg.CancelJob(job.id))
        trace.log.warning("job.withdrawn", job_id=job.id, why="the job store could not be written")

    def _place_at_once(
        self, asked: placement.Job, devices: list[placement.Device]
    ) -> list[Worker] | None:
        """Where a new job starts now, as dispatch() would place it: nothing is waiting (it
        would go first) and a slot is free; else None, and the job queues."""
        if self.queue or not self.accepting:
            return None
        return self._place(asked, devices)  # placement checks the caps and the slots

    # -- the job state machine ------------------------------------------------------------

    def _move(self, job: JobRecord, state: JobState, error: JobErrorView | None = None) -> bool:
        """The one place a job's status changes; the run queue follows it, so a job is in the
        queue exactly while it is queued, and once. A finished job never changes again: the
        change is dropped (traced at debug) and False returned."""
        if job.status.finished:
            trace.log.debug(
                "job.change_dropped", job_id=job.id, status=job.status.value, to=state.value
            )
            return False
        job.status = state
        if state is JobState.queued:
            job.started_at = None
            self.queue.add(job)
        else:
            self.queue.remove(job.id)
        if state.finished:
            job.error, job.finished_at = error, time.time()
        if job.program is not None:
            self.programs.changed(job.id)
        return True

    def _trace(self, job: JobRecord) -> None:
        """The job's trace line as it stands, written once the store has committed it."""
        self.store.tell(job_line(job), Tell.TRACE, job.id)

    # -- placement ------------------------------------------------------------------------

    def dispatch(self) -> None:
        """Start every queued job that can run now, in priority order."""
        if not self.accepting:
            return  # stopping: queued jobs stay queued in the store for the next start
        if not self.queue:
            return  # every job's finish calls this; most often nothing waits
        index, devices, rules, granted = 0, self._devices(), self.policy.rules, False
        starts: list[tuple[JobRecord, Worker, dict[str, Any]]] = []
        while index < len(self.queue) and placement.has_capacity(
            devices, self.running_total, rules
        ):
            job = self.queue.at(index)
            placed = self._place(wanted(job), devices)
            if placed is None:
                index += 1
                continue
            if job.program is not None:
                self.programs.grant(job, placed)
                granted = True
            elif (inputs := self._input_refs(job)) is not None:  # None: out of the queue, failed
                self._mark_started(job, placed[0], time.time())
                starts.append((job, placed[0], inputs))
            devices = self._devices()  # that worker's load changed
        if starts or granted:
            # Committed before the orders leave: a kill -9 after one finds its job running
            # (interrupted, or retried as it allows, its attempt counted), never queued to
            # run again. On a full disk the orders still leave (Tell.ANSWER): holding every
            # accepted job until space returns would stop the host's work for a fault the
            # store already reports.
            self.store.tell(functools.partial(self._send_each, starts))

    def _send_each(self, starts: list[tuple[JobRecord, Worker, dict[str, Any]]]) -> None:
        for job, worker, inputs in starts:
            self.orders.send(worker, job.id, job.task, job.params, job.keep_outputs, inputs)

    def _place(self, asked: placement.Job, devices: list[placement.Device]) -> list[Worker] | None:
        return self.placer.place(asked, devices, self.policy.rules, self.running_total)

    def _devices(self) -> list[placement.Device]:
        """The workers as placement sees them, with what the programs' leases hold."""
        return self.placer.devices(self.programs.held() if self.programs.granted else None)

    def apply_policy(self, policy: Policy) -> None:
        """A reload's new scheduling keys: in force for the next placement."""
        self.policy = policy
        self.dispatch()

    def _mark_started(self, job: JobRecord, worker: Worker, started_at: float) -> None:
        self._mark_running(job, worker, started_at)
        self.store.save(job)
        if job.timeout_s:
            handle = asyncio.get_running_loop().call_later(job.timeout_s, self.time_out, job.id)
            self._timers[job.id] = handle
        self._trace(job)

    def _input_refs(self, job: JobRecord) -> dict[str, Any] | None:
        """The job's input arrays; None (and the job failed) when one is gone."""
        refs = self.orders.inputs(job.id, job.inputs)
        lost = [name for name, ref in refs.items() if ref is None]
        if lost:  # /dev/shm was cleared (a reboot): never run on other data than was sent
            message = (
                f"input {', '.join(lost)} is gone: uploads live in /dev/shm, which a reboot clears"
            )
            self._finish(job, JobState.failed, _error("missing_input", message, "upload it again"))
            return None
        return refs

    def _mark_running(self, job: JobRecord, worker: Worker, started_at: float) -> None:
        info = worker.info
        assert info is not None  # only warm workers have free slots
        self._move(job, JobState.running)
        job.started_at = started_at
        job.queue_ms = (started_at - job.created_at) * 1e3
        job.backend, job.device, job.device_index = info.backend, info.device, info.index
        job.device_uuid, job.compute_capability = info.uuid, info.compute_capability
        job.fallback_reason = worker.spec.fallback_reason
        job.fallback = job.fallback_reason is not None
        job.worker_pid = worker.pid
        job.node_id, job.node_hostname = info.extra.get("node_id"), info.extra.get("hostname")
        worker.running.add(job.id)
        worker.reserved_bytes += job.estimate_bytes
        self.running_total += 1
        self._idle.clear()

    # -- cancel and timeouts --------------------------------------------------------------

    def cancel(self, job_id: str, peer: Peer) -> JobRecord:
        job = self.get(job_id)
        check_access(job, peer, "cancel")
        if job.status is JobState.queued:
            self._finish(job, JobState.cancelled, _error("cancelled", "cancelled while queued"))
        elif job.status is JobState.running:
            self._stop(job_id, JobState.cancelled)
        return job

    def get(self, job_id: str) -> JobRecord:
        job = self.store.get(job_id)
        if job is None:
            raise JobNotFound(
                Text("no job with id {job_id}", job_id=repr(job_id)),
                Text("list jobs with `taogpuctl list`"),
            )
        return job

    def time_out(self, job_id: str) -> None:
        """The job's timeout_s has passed (its timer): stop it if it still runs."""
        self._stop(job_id, JobState.timed_out)

    def _stop(self, job_id: str, reason: JobState) -> None:
        if job_id in self.programs:
            self.programs.stop(job_id, reason)
            return
        worker = self._worker_running(job_id)
        if worker is None or job_id in self._stop_reason:
            return
        self._stop_reason[job_id] = reason
        worker.send(msg.CancelJob(job_id))
        asyncio.get_running_loop().call_later(CANCEL_GRACE_S, self._kill_if_stuck, job_id, worker)

    def _kill_if_stuck(self, job_id: str, worker: Worker) -> None:
        if job_id in worker.running:
            trace.log.error("job.stuck", job_id=job_id, device=worker.label, grace_s=CANCEL_GRACE_S)
            worker.kill()  # its loss ends the stuck job and fails the others on it

    def _worker_running(self, job_id: str) -> Worker | None:
        return next((w for w in self.pool.workers if job_id in w.running), None)

    # -- results from the pool ------------------------------------------------------------

    def on_job_finished(self, worker: Worker, finished: msg.JobFinished) -> None:
        """A worker's result. Taken only for a job that runs there now: a finish that comes
        after the job ended (interrupted at the drain deadline, withdrawn) is dropped."""
        withdrawn = self._withdrawn.pop(finished.job_id, None)
        job = withdrawn or self.store.get(finished.job_id)
        ours = finished.job_id in worker.running
        self._release(worker, finished.job_id, job)
        if withdrawn is not None or job is None or not ours or job.status.finished:
            trace.log.debug(
                "job.finish_dropped",
                job_id=finished.job_id,
                device=worker.label,
                status=job.status.value if job else None,
                reported=finished.status,
            )
            self.dispatch()
            return
        job.run_ms = finished.run_ms
        job.evidence = finished.evidence
        if self.policy.enable_profiling:
            job.timings = finished.timings
        state = self._stop_reason.pop(job.id, None) or JobState(finished.status)
        if state is JobState.succeeded:
            job.result = finished.result
            job.outputs = [_output_view(f) for f in finished.outputs.values()]
            self._finish(job, state, None)
        else:
            shutil.rmtree(self.outputs_dir / job.id, ignore_errors=True)
            self._finish(job, state, _finished_error(state, finished, job))
        worker.jobs_done += 1
        self.dispatch()

    def on_worker_lost(self, worker: Worker) -> None:
        for job_id in list(worker.running):
            withdrawn = self._withdrawn.pop(job_id, None)
            job = withdrawn or self.store.get(job_id)
            self._release(worker, job_id, job)
            if job is None or withdrawn is not None or job.status.finished:
                continue
            state = self._stop_reason.pop(job_id, None) or JobState.failed
            died = f"the worker for {worker.label} died ({worker.exit_description()}) while it ran"
            if state is JobState.failed and self._retry(job, died):
                continue
            hint = "submit it again (or with max_retries to have it retried)"
            code = "worker_crashed" if state is JobState.failed else state.value
            self._finish(job, state, _error(code, died, hint))
        self.dispatch()

    def _retry(self, job: JobRecord, why: str) -> bool:
        """Queue the job again if it allows another attempt; says whether it did."""
        job.attempts += 1
        if job.attempts > job.max_retries:
            return False
        trace.log.warning("job.retry", job_id=job.id, attempt=job.attempts, why=why)
        self._move(job, JobState.queued)
        self.store.save(job)
        return True

    def recover(self, jobs: list[JobRecord]) -> None:
        """Jobs a previous run accepted and did not finish: queued ones queue again, running
        ones are retried when they allow it, else marked interrupted. Each is queued once,
        by _move, whichever way it came back."""
        for job in jobs:
            self.jobs_total += 1
            self.arrays.pin(list(job.inputs.values()))  # _finish unpins, the queue keeps them
            if job.program is not None:
                self.programs.recover(job)
            elif job.memory is not None:  # its inputs were in a client's memory, gone with us
                message = "taogpud stopped before the job ran; the client's memory went with it"
                self._finish(job, JobState.interrupted, _error("interrupted", message))
            elif job.status is JobState.queued:
                self._move(job, JobState.queued)
            elif not self._retry(job, "taogpud restarted"):
                message = "taogpud stopped while the job ran (it restarted since)"
                self._finish(job, JobState.interrupted, _error("interrupted", message))
        trace.log.info("store.recovered", jobs=len(jobs), queued=len(self.queue))
        self.dispatch()

    def on_worker_warm(self, worker: Worker) -> None:
        self.dispatch()

    def _release(self, worker: Worker, job_id: str, job: JobRecord | None) -> None:
        if job_id in worker.running:
            worker.running.discard(job_id)
            worker.reserved_bytes -= job.estimate_bytes if job else 0
            self.running_total -= 1
        self._end_timer(job_id)

    def _end_timer(self, job_id: str) -> None:
        timer = self._timers.pop(job_id, None)
        if timer is not None:
            timer.cancel()
        if self.running_total == self.programs.granted:  # a program is the user's: drain
            self._idle.set()  # never waits for it

    def _finish(self, job: JobRecord, state: JobState, error: JobErrorView | None) -> None:
        if not self._move(job, state, error):
            return
        if job.started_at is None and job.finished_at is not None:
            job.queue_ms = (job.finished_at - job.created_at) * 1e3
        self.arrays.unpin(list(job.inputs.values()))
        regions = self.orders.let_go(job.id)
        if job.program is not None:
            self.programs.end(job)
        self.store.mark_finished(job)
        if regions is not None:
            regions.release()  # the client's memory is the daemon's to close once no job names it
        self.finished_counts[(job.task, job.backend or "none", state.value)] += 1
        self.job_times.observe(job)
        self._trace(job)

    # -- programs: a user's own process under a lease (taogpud.jobs.programs) ---------------

    def submit_program(self, request: ProgramRequest, peer: Peer) -> JobRecord:
        """Queue a program for its caller, the process that will start it once granted. Its
        client is followed from now: gone before its program starts, the job ends."""
        admission.check_open(self.accepting, self.store)
        admission.check_executor(self.pool)
        client = programs.caller(peer)
        devices = self._devices()
        admission.check_program_room(request, devices, len(self.queue), self.policy)
        job = self.programs.admit(request, peer, client)
        self.jobs_total += 1
        self._trace(job)
        placed = self._place_at_once(wanted(job), devices)
        if placed is not None:
            self.programs.grant(job, placed)
        else:
            self._move(job, JobState.queued)
        return job

    def _run_lease(self, job: JobRecord) -> None:
        """A granted lease counts as a running job until it ends; its timeout runs from the
        grant (an adopted lease's from its first grant)."""
        self.running_total += 1
        if job.timeout_s:
            left = job.timeout_s - (time.time() - (job.started_at or time.time()))
            loop = asyncio.get_running_loop()
            self._timers[job.id] = loop.call_later(max(left, 0.0), self.time_out, job.id)

    def _lease_ended(self, job_id: str, counted: bool) -> None:
        if counted:
            self.running_total -= 1
        self._end_timer(job_id)

    # -- stopping -------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> int:
        """Take no new jobs, let running ones finish within timeout_s; return how many did not."""
        self.accepting = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        return self.running_total - self.programs.granted

    def interrupt_running(self) -> None:
        """The jobs still running at the drain deadline: queued again for the next start when
        they allow another attempt (a restart, an upgrade), else interrupted. Not a job whose
        inputs are a client's memory, nor a program: neither outlives this daemon."""
        for worker in self.pool.workers:
            for job_id in list(worker.running):
                job = self._withdrawn.pop(job_id, None) or self.store.get(job_id)
                self._release(worker, job_id, job)
                if job is not None and job.status is JobState.running:
                    self._interrupt(job)

    def _interrupt(self, job: JobRecord) -> None:
        outlives = job.memory is None and job.program is None
        if not (outlives and self._retry(job, "taogpud stopped (drain timeout)")):
            message = "taogpud stopped while the job ran (drain timeout)"
            self._finish(job, JobState.interrupted, _error("interrupted", message))


def _error(code: str, message: str, hint: str = "") -> JobErrorView:
    return JobErrorView(code=code, message=message, hint=hint)


def _finished_error(state: JobState, finished: msg.JobFinished, job: JobRecord) -> JobErrorView:
    if state is JobState.timed_out:
        return _error(
            "timed_out", f"the job ran past its timeout of {job.timeout_s} s", "raise --timeout"
        )
    if state is JobState.cancelled:
        return _error("cancelled", "cancelled while running")
    code, message, hint = finished.error or ("task_failed", "the task failed", "")
    return _error(code, message, hint)


def _output_view(output: msg.OutputFile) -> OutputView:
    return OutputView(
        name=output.name,
        shape=list(output.shape),
        dtype=output.dtype,
        nbytes=output.nbytes,
        offset=output.offset,
        written=output.written,
    )
