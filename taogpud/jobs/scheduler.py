"""The coordinator of jobs: the only place job states change (_move).

What a job must pass to enter is taogpud.jobs.admission's; the jobs waiting, in the order
they start, are taogpud.jobs.runqueue's (it follows the states). Placement when a slot frees
is decided by `taogpud.jobs.placement` (pure: caps, affinity, strategy) over a plain view of
the workers; the scheduler applies the decision.
"""

from __future__ import annotations

import asyncio
import functools
import shutil
import signal
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from taogpud.arrayfiles.store import ArrayStore
from taogpud.errors import (
    Conflict,
    JobNotFound,
    NotPermitted,
    RequestError,
    StateDiskFull,
)
from taogpud.i18n import Text
from taogpud.jobs import admission, placement
from taogpud.jobs.access import check_access
from taogpud.jobs.memory import JobRegions
from taogpud.jobs.policy import Policy
from taogpud.jobs.records import (
    PROGRAM_TASK,
    JobErrorView,
    JobRecord,
    JobState,
    OutputView,
    Peer,
    ProgramView,
    new_job_id,
)
from taogpud.jobs.runqueue import RunQueue
from taogpud.jobs.store import JobStore, Tell
from taogpud.observability import metrics, trace
from taogpud.observability.nvml import GpuDevice, Xid
from taogpud.pool import protocol as msg
from taogpud.pool.interface import Pool, Worker, WorkerState
from taogpud.programs import leases, proof
from taogpud.programs.logs import ProgramLogs
from taogpud.wire import JobRequest, ProgramRequest

CANCEL_GRACE_S = 5.0  # a running job told to stop gets this long before its worker is killed


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
        self.job_times = (
            metrics.JobTimes()
        )  # queue and run time histograms (taogpud.observability.metrics)
        # The run queue follows the job states: a job is in it exactly while its status is
        # queued, and only _move puts it there or takes it out (see _move). Read it; never
        # change it from outside.
        self.queue = RunQueue()
        self._withdrawn: dict[str, JobRecord] = {}  # running jobs whose submit was refused
        self._rr_next = 0
        self._affinity: dict[str, int] = {}  # affinity key → device index
        self._stop_reason: dict[str, JobState] = {}  # running job → cancelled | timed_out
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._idle = asyncio.Event()
        self._idle.set()
        self._regions: dict[str, JobRegions] = {}  # job id → its regions in a client's memory
        self._programs: dict[str, Lease] = {}  # every unfinished program: its lease, processes
        self._granted = 0  # programs holding devices now (counted in running_total too)
        self._lease_changes: dict[str, asyncio.Event] = {}  # set when a lease's phase changes
        self._stop_errors: dict[str, JobErrorView] = {}  # a program stopped for what NVML saw
        self.program_verdicts: Counter[str] = Counter()  # proof.Verdict codes given, by code
        self.program_logs = ProgramLogs(outputs_dir)  # detached programs' output
        self._log_growth: dict[str, asyncio.Event] = {}  # set when a log grows or its job ends

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
            self._regions[job_id] = regions
        wanted = placement.Job(estimate, request.device, request.affinity)
        placed = self._place_at_once(wanted, devices)
        worker = placed[0] if placed else None
        if worker is not None:  # its order leaves first: the worker runs while the job is made
            refs = self._refs_of(job_id, inputs)  # found by admission.check_job above
            sent_at = self._send(worker, job_id, task.name, params, request.keep_outputs, refs)
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
        self._regions.pop(job.id, None)  # the submitter releases the client memory it held
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
        self, wanted: placement.Job, devices: list[placement.Device]
    ) -> list[Worker] | None:
        """Where a new job starts now, as dispatch() would place it: nothing is waiting (it
        would go first) and a slot is free; else None, and the job queues."""
        if self.queue or not self.accepting:
            return None
        return self._place(wanted, devices)  # placement checks the caps and the slots

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
            self._lease_changed(job.id)
        return True

    def _trace(self, job: JobRecord) -> None:
        """The job's trace line as it stands, written once the store has committed it."""
        self.store.tell(trace.job_line(job), Tell.TRACE, job.id)

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
            placed = self._place(_wanted(job), devices)
            if placed is None:
                index += 1
                continue
            if job.program is not None:
                self._grant(job, placed)
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
            self._send(worker, job.id, job.task, job.params, job.keep_outputs, inputs)

    def _place(self, wanted: placement.Job, devices: list[placement.Device]) -> list[Worker] | None:
        """Where a job starts now (placement.place decides: one worker, or `count` for a
        program's --gpus), or None: it waits."""
        workers = self.pool.workers
        decision = placement.place(
            wanted,
            devices,
            self.policy.rules,
            running_total=self.running_total,
            rr_next=self._rr_next,
            affinity=self._affinity,
        )
        self._rr_next = decision.rr_next
        if decision.position is None:
            return None
        if decision.remember is not None:
            key, index = decision.remember
            self._affinity[key] = index
        return [workers[position] for position in decision.positions]

    def _devices(self) -> list[placement.Device]:
        """The workers as placement sees them, in pool order, with the programs' leases."""
        if not self._granted:
            return [_device(w) for w in self.pool.workers]
        held = self._held()
        return [_device(w, held.get(w.spec.index)) for w in self.pool.workers]

    def _held(self) -> dict[int, Held]:
        """What the granted leases hold, by device index."""
        held: dict[int, Held] = {}
        for lease in self._programs.values():
            for index, reserved in zip(lease.indexes, lease.reserved, strict=True):
                total = held.get(index, Held())
                held[index] = Held(
                    total.running + 1, total.whole or lease.whole, total.bytes + reserved
                )
        return held

    def apply_policy(self, policy: Policy) -> None:
        """A reload's new scheduling keys: in force for the next placement."""
        self.policy = policy
        self.dispatch()

    def _send(
        self,
        worker: Worker,
        job_id: str,
        task: str,
        params: dict[str, Any],
        keep_outputs: bool,
        inputs: dict[str, Any],
    ) -> float:
        """The order to the worker; its result is read in a later callback of the loop. At
        submit the order leaves before the daemon notes the start (15–20 µs of a tiny job's
        round trip in an A/B of bench/run.py's dispatch): the job is not accepted until the
        API's commit, so a crash in between leaves no job to run again. From the queue,
        dispatch() commits the start first."""
        output_dir = str(self.outputs_dir / job_id) if keep_outputs else None
        regions = self._regions.get(job_id)
        output_region = regions.output if regions is not None else None
        sent_at = time.time()  # its start: the worker may run before the daemon notes it
        worker.send(msg.RunJob(job_id, task, params, inputs, output_dir, output_region))
        return sent_at

    def _mark_started(self, job: JobRecord, worker: Worker, started_at: float) -> None:
        self._mark_running(job, worker, started_at)
        self.store.save(job)
        if job.timeout_s:
            handle = asyncio.get_running_loop().call_later(job.timeout_s, self.time_out, job.id)
            self._timers[job.id] = handle
        self._trace(job)

    def _input_refs(self, job: JobRecord) -> dict[str, Any] | None:
        """The job's input arrays; None (and the job failed) when one is gone."""
        refs = self._refs(job)
        lost = [name for name, ref in refs.items() if ref is None]
        if lost:  # /dev/shm was cleared (a reboot): never run on other data than was sent
            message = (
                f"input {', '.join(lost)} is gone: uploads live in /dev/shm, which a reboot clears"
            )
            self._finish(job, JobState.failed, _error("missing_input", message, "upload it again"))
            return None
        return refs

    def _refs(self, job: JobRecord) -> dict[str, Any]:
        return self._refs_of(job.id, job.inputs)

    def _refs_of(self, job_id: str, inputs: dict[str, str]) -> dict[str, Any]:
        regions = self._regions.get(job_id)
        if regions is not None:
            return dict(regions.inputs)
        return {name: self.arrays.get(array_id) for name, array_id in inputs.items()}

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
        if job_id in self._programs:
            self._stop_program(job_id, reason)
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
                self._recover_program(job)
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
        if self.running_total == self._granted:  # programs are the user's: drain never waits
            self._idle.set()

    def _finish(self, job: JobRecord, state: JobState, error: JobErrorView | None) -> None:
        if not self._move(job, state, error):
            return
        if job.started_at is None and job.finished_at is not None:
            job.queue_ms = (job.finished_at - job.created_at) * 1e3
        self.arrays.unpin(list(job.inputs.values()))
        regions = self._regions.pop(job.id, None)
        if job.program is not None:
            self._end_lease(job)
        self.store.mark_finished(job)
        if regions is not None:
            regions.release()  # the client's memory is the daemon's to close once no job names it
        self.finished_counts[(job.task, job.backend or "none", state.value)] += 1
        self.job_times.observe(job)
        self._trace(job)

    # -- programs: a user's own process under a lease (docs/programs.md) --------------------

    def submit_program(self, request: ProgramRequest, peer: Peer) -> JobRecord:
        """Queue a program for its caller, the process that will start it once granted. Its
        client is followed from now: gone before its program starts, the job ends."""
        admission.check_open(self.accepting, self.store)
        admission.check_executor(self.pool)
        client_pid, client_start = _caller(peer)
        devices = self._devices()
        admission.check_program_room(request, devices, len(self.queue), self.policy)
        mem = request.mem_bytes
        program = ProgramView(gpus=request.gpus, share=request.share, mem_bytes=mem)
        program.client_pid, program.client_start = client_pid, client_start
        job = JobRecord(
            id=new_job_id(),
            task=PROGRAM_TASK,
            params={"argv": request.argv, "cwd": request.cwd, "name": request.name},
            priority=request.priority,
            timeout_s=request.timeout_s or self.policy.job_timeout_s,
            affinity=request.affinity,
            requested_device=request.device,
            peer=peer,
            estimate_bytes=mem or 0,
            program=program,
        )
        self.store.add(job)
        self.jobs_total += 1
        self._programs[job.id] = Lease(self._watch(job.id, client_pid, client_start, client=True))
        self._trace(job)
        placed = self._place_at_once(_wanted(job), devices)
        if placed is not None:
            self._grant(job, placed)
        else:
            self._move(job, JobState.queued)
        return job

    def _grant(self, job: JobRecord, workers: list[Worker]) -> None:
        """The lease: the devices are the program's from now, until it and its children end."""
        program, lease, now = job.program, self._programs[job.id], time.time()
        assert program is not None
        infos = [w.info for w in workers if w.info is not None]  # placed: every one is warm
        reserved = [program.mem_bytes or info.memory_cap_bytes for info in infos]
        granted = [leases.Granted(i.backend, i.device, i.uuid, w.spec.thread_num)
                   for i, w in zip(infos, workers, strict=True)]  # fmt: skip
        self._move(job, JobState.running)
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
        """Count a granted lease and arm its timeout."""
        self.running_total += 1
        self._granted += 1
        if job.timeout_s:
            left = job.timeout_s - (time.time() - (job.started_at or time.time()))
            loop = asyncio.get_running_loop()
            self._timers[job.id] = loop.call_later(max(left, 0.0), self.time_out, job.id)
        self.store.save(job)
        self._trace(job)

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

    def _lease_changed(self, job_id: str) -> None:
        for events in (self._lease_changes, self._log_growth):
            event = events.pop(job_id, None)
            if event is not None:
                event.set()

    def append_program_log(self, job_id: str, peer: Peer, data: bytes) -> None:
        """Output of a program (its starter sends it: `--detach`), kept up to the bound."""
        job, _ = self._granted_program(job_id, peer, "write the log of")
        program = job.program
        assert program is not None
        kept = self.program_logs.append(job_id, data, self.policy.program_log_bytes)
        program.log_bytes += kept
        program.log_dropped_bytes += len(data) - kept
        event = self._log_growth.pop(job_id, None)
        if event is not None:
            event.set()

    def log_growth(self, job_id: str) -> asyncio.Event:
        """An event set when the program's log next grows, or its job ends."""
        return self._log_growth.setdefault(job_id, asyncio.Event())

    def program_started(self, job_id: str, pid: int, peer: Peer) -> JobRecord:
        """The starter's word that the program runs as `pid`: checked to be the caller's own
        process (its uid) and its descendant, then followed until it ends."""
        job, lease = self._granted_program(job_id, peer, "start the program of")
        program = job.program
        assert program is not None
        if program.pid is not None:
            raise Conflict(
                f"job {job_id}'s program was started already (pid {program.pid})",
                "a program is started once: submit it again to run it again",
            )
        process = _callers_process(pid, peer)
        program.pid, program.pid_start = pid, process.start
        lease.program = self._watch(job_id, pid, process.start, client=False)
        lease.proof = self._proof_for(job)
        self.store.save(job)
        trace.log.info("program.started", job_id=job_id, pid=pid, devices=program.devices)
        return job

    def _granted_program(self, job_id: str, peer: Peer, action: str) -> tuple[JobRecord, Lease]:
        job = self.get(job_id)
        check_access(job, peer, action)
        lease = self._programs.get(job_id)
        if job.program is None or lease is None or job.status is not JobState.running:
            what = "a program" if job.program is not None else f"a {job.task} job, not a program"
            raise Conflict(
                f"job {job_id} is {what} and {job.status.value}: it holds no lease now",
                "wait for its lease (GET /v1/programs/{id}/lease) before starting it",
            )
        return job, lease

    def program_exited(self, job_id: str, peer: Peer, exit: ProgramExit) -> JobRecord:
        """The starter's word that the program (and every descendant) is gone: the job ends
        with its exit status and the lease is released. A second word is ignored. With a
        pid, the word of its start comes with it (a program that ended before its starter
        said it started: one request instead of two), checked as program_started checks it."""
        job = self.get(job_id)
        check_access(job, peer, "report the exit of")
        if job.status.finished:
            return job
        if exit.pid is not None and (job.program is None or job.program.pid != exit.pid):
            self.program_started(job_id, exit.pid, peer)
        if job.program is None or job.status is not JobState.running:
            self._granted_program(job_id, peer, "report the exit of")  # raises Conflict
        job.result = {"exit_code": exit.exit_code, "signal": exit.signal}
        if job.started_at is not None:
            job.run_ms = (time.time() - job.started_at) * 1e3
        state = self._stop_reason.pop(job_id, None) or exit.state()
        self._finish(job, state, self._stop_errors.pop(job_id, None) or exit.error(state, job))
        self.dispatch()
        return job

    def _watch(self, job_id: str, pid: int, start: int, *, client: bool) -> leases.Watch:
        gone = self._client_gone if client else self._program_gone
        return leases.Watch(pid, start, functools.partial(gone, job_id))

    def _client_gone(self, job_id: str) -> None:
        """The process that asked for the lease exited: a program it never started will not
        be; one it started runs on under its lease (it is the user's) until it ends."""
        job, lease = self.store.get(job_id), self._programs.get(job_id)
        if job is None or lease is None or job.status.finished:
            return
        lease.client_gone = True
        program = job.program
        assert program is not None
        if lease.program is None:
            pid = program.client_pid
            message = f"its client (pid {pid}) exited before it started the program"
            self._finish(job, JobState.cancelled, _error("client_gone", message))
            self.dispatch()
        elif lease.program.ended:
            self._program_gone(job_id)
        else:
            trace.log.warning("program.unattended", job_id=job_id, pid=program.pid)
            if program.stop:
                self._signal_program(job_id, signal.SIGTERM)

    def _program_gone(self, job_id: str) -> None:
        """The program exited. Its starter, alive, reports its status once every descendant
        is gone too; with its starter gone, no one can: the job ends without one."""
        job, lease = self.store.get(job_id), self._programs.get(job_id)
        if job is None or lease is None or job.status.finished or not lease.client_gone:
            return
        state = self._stop_reason.pop(job_id, None) or JobState.interrupted
        message = "the program ended after its starter exited: its exit status is unknown"
        error = self._stop_errors.pop(job_id, None) or _error(state.value, message)
        self._finish(job, state, error)
        self.dispatch()

    def _stop_program(self, job_id: str, reason: JobState) -> None:
        """Ask the program's starter to stop it (SIGTERM, then SIGKILL after its grace); the
        daemon signals it itself only where its starter is gone and it may."""
        job, lease = self.store.get(job_id), self._programs.get(job_id)
        if job is None or job.program is None or lease is None or job.program.stop:
            return
        self._stop_reason[job_id] = reason
        job.program.stop = reason.value
        self.store.save(job)
        self._lease_changed(job_id)
        if lease.client_gone:
            self._signal_program(job_id, signal.SIGTERM)

    def _signal_program(self, job_id: str, signum: int) -> None:
        lease = self._programs.get(job_id)
        if lease is None or lease.program is None or not lease.program.signal(signum):
            return
        if signum == signal.SIGTERM:
            loop = asyncio.get_running_loop()
            loop.call_later(CANCEL_GRACE_S, self._signal_program, job_id, signal.SIGKILL)

    def _end_lease(self, job: JobRecord) -> None:
        """A finished program's devices go back (its record keeps what it was given)."""
        lease = self._programs.pop(job.id, None)
        if lease is None:
            return
        lease.close()
        if lease.proof is not None:
            job.evidence = lease.proof.evidence()
        self._stop_reason.pop(job.id, None)
        self._stop_errors.pop(job.id, None)
        if lease.indexes:
            self.running_total -= 1
            self._granted -= 1
        self._end_timer(job.id)

    # -- programs: the proof (proof.py), from NVML samples -----------------------------------

    def _proof_for(self, job: JobRecord) -> proof.ProgramProof | None:
        """A CUDA lease is watched through NVML; another backend has nothing to show."""
        program = job.program
        if program is None or job.backend != "cuda" or None in program.device_uuids:
            return None
        return proof.ProgramProof(
            uuids=tuple(u for u in program.device_uuids if u is not None),
            labels=tuple(program.devices),
            reserved_bytes=tuple(program.reserved_bytes),
            first_use_timeout_s=self.policy.first_use_timeout_s,
            started_s=time.monotonic(),
        )

    @property
    def watching_programs(self) -> bool:
        """Whether a running program awaits NVML samples (observe_programs)."""
        return any(lease.proof is not None for lease in self._programs.values())

    def observe_programs(
        self, devices: Sequence[GpuDevice], now_s: float, xids: Sequence[Xid] | None = None
    ) -> None:
        """One NVML sample for every program under a CUDA lease: its evidence updated, and
        what it leads to done (a stop with the reason, or a flag). `xids`: those NVML
        reported since the last sample; None where it cannot (no XID section then)."""
        children = proof.children_now()
        for job_id, lease in list(self._programs.items()):
            job = self.store.get(job_id)
            if lease.proof is None or job is None or job.status is not JobState.running:
                continue
            pids = _program_pids(job, lease, children)
            for verdict in lease.proof.observe(devices, pids, now_s):
                self._act_on(job, verdict)
            if xids is not None:
                self._record_xids(job, lease.proof, xids, now_s)
            job.evidence = lease.proof.evidence()
            self.store.save(job)

    def _record_xids(
        self, job: JobRecord, watched: proof.ProgramProof, xids: Sequence[Xid], now_s: float
    ) -> None:
        """Each XID on its GPUs: a warning line now; its evidence keeps them all."""
        for xid in watched.record_xids(xids, now_s):
            trace.log.warning("program.xid", job_id=job.id, **xid)

    def _act_on(self, job: JobRecord, verdict: proof.Verdict) -> None:
        self.program_verdicts[verdict.code] += 1
        trace.log.warning("program." + verdict.code, job_id=job.id, message=verdict.message)
        flagged = verdict.code == "unassigned_gpu" or (
            verdict.code == "never_used_gpu" and self.policy.allow_fallback_to_cpu
        )
        if flagged:
            job.fallback = job.fallback or verdict.code == "never_used_gpu"
            job.fallback_reason = verdict.message if job.fallback else job.fallback_reason
            job.evidence = {**job.evidence, "flag": verdict.code}
            self._trace(job)
            return
        self._stop_errors[job.id] = _error(verdict.code, verdict.message, verdict.hint)
        self._stop_program(job.id, JobState.failed)

    def _recover_program(self, job: JobRecord) -> None:
        """A program a previous run accepted. Queued, it queues again while its client lives;
        granted, its lease is adopted while its program or its starter lives (pid and start
        time: a pid given again is not theirs), its devices held as before; else it ends."""
        program = job.program
        assert program is not None
        client_alive = leases.alive(program.client_pid, program.client_start)
        program_alive = leases.alive(program.pid, program.pid_start)
        if job.status is JobState.queued and client_alive:
            self._programs[job.id] = Lease(self._rewatch(job, client=True))
            self._move(job, JobState.queued)
        elif job.status is JobState.running and (client_alive or program_alive):
            self._adopt(job, client_alive)
        else:
            self._programs[job.id] = Lease()
            self._end_unadopted(job)

    def _rewatch(self, job: JobRecord, *, client: bool) -> leases.Watch:
        program = job.program
        assert program is not None
        pid, start = (
            (program.client_pid, program.client_start)
            if client
            else (program.pid, program.pid_start)
        )
        assert pid is not None and start is not None
        return self._watch(job.id, pid, start, client=client)

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
        self._programs[job.id] = lease
        if client_alive:
            lease.client = self._rewatch(job, client=True)
        if program.pid is not None:  # gone already: its watch says so, its starter reports
            lease.program = self._rewatch(job, client=False)
            lease.proof = self._proof_for(job)
        if program.stop:
            self._stop_reason[job.id] = JobState(program.stop)
        trace.log.info("program.adopted", job_id=job.id, pid=program.pid, devices=program.devices)
        self._hold(job)

    def _end_unadopted(self, job: JobRecord) -> None:
        if job.status is JobState.queued:
            message = "taogpud restarted and the program's client is gone"
            self._finish(job, JobState.cancelled, _error("client_gone", message))
        else:
            message = (
                "taogpud stopped while the program held its lease, and neither the program "
                "nor its starter runs any more: its exit status is unknown"
            )
            self._finish(job, JobState.interrupted, _error("interrupted", message))

    # -- stopping -------------------------------------------------------------------------

    async def drain(self, timeout_s: float) -> int:
        """Take no new jobs, let running ones finish within timeout_s; return how many did not."""
        self.accepting = False
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            pass
        return self.running_total - self._granted

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


@dataclass
class Lease:
    """An unfinished program's bookkeeping: its client while it waits, then the devices it
    holds and its process. Its record (JobRecord.program) is what the store keeps."""

    client: leases.Watch | None = None  # the process that asked and starts the program
    program: leases.Watch | None = None  # the program, once its starter reported it
    indexes: list[int] = field(default_factory=list)  # the devices held (empty while queued)
    reserved: list[int] = field(default_factory=list)  # bytes reserved on each
    whole: bool = True  # every slot of its devices (no --share)
    client_gone: bool = False
    proof: proof.ProgramProof | None = None  # what NVML saw (a CUDA lease), once started

    def close(self) -> None:
        for watch in (self.client, self.program):
            if watch is not None:
                watch.close()


class Held(NamedTuple):
    """What the programs' leases hold of one device."""

    running: int = 0
    whole: bool = False
    bytes: int = 0


def _wanted(job: JobRecord) -> placement.Job:
    program = job.program
    if program is None:
        return placement.Job(job.estimate_bytes, job.requested_device, job.affinity)
    whole, reserve_cap = not program.share, program.mem_bytes is None
    return placement.Job(
        job.estimate_bytes, job.requested_device, job.affinity, program.gpus, whole, reserve_cap
    )


def _device(worker: Worker, held: Held | None = None) -> placement.Device:
    info, spec = worker.info, worker.spec
    running, free, reserved = len(worker.running), worker.free_slots, worker.reserved_bytes
    if held is not None:  # a program's lease takes a slot, or every slot, and its memory
        running, reserved = running + held.running, reserved + held.bytes
        free = 0 if held.whole else max(free - held.running, 0)
    return placement.Device(  # index, slots, running, free_slots, reserved_bytes, cap, alive
        spec.index,
        spec.stream_count,
        running,
        free,
        reserved,
        info.memory_cap_bytes if info and info.memory_cap_bytes > 0 else None,
        worker.state is not WorkerState.dead,
    )


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


class ProgramExit(NamedTuple):
    """How a program ended, as its starter saw it (it is the program's parent)."""

    exit_code: int | None  # None: killed by a signal, or never started
    signal: str | None = None  # "SIGKILL"
    cancelled: bool = False  # its starter stopped it (Ctrl-C in `taogpuctl exec`)
    not_started: str | None = None  # why it could not be started (exec failed)
    pid: int | None = None  # its start, reported with its end (program_exited)

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


def _how_it_ended(exit: ProgramExit) -> str:
    if exit.signal is not None:
        return f"was killed by {exit.signal}"
    return f"exited with status {exit.exit_code}"


def _labels(infos: list[Any]) -> str:
    return ",".join(info.device for info in infos)


def _caller(peer: Peer) -> tuple[int, int]:
    """The calling process (SO_PEERCRED): its pid and start time. A lease follows it."""
    start = None if peer.pid is None else leases.start_time(peer.pid)
    if peer.pid is None or start is None:
        raise RequestError(
            f"taogpud cannot see the calling process (pid {peer.pid}) in /proc",
            "submit programs from this host's own process namespace",
        )
    return peer.pid, start


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


def _program_pids(job: JobRecord, lease: Lease, children: dict[int, list[int]]) -> set[int]:
    """The program's processes: its own tree, and the orphans its starter (their subreaper)
    took in, the starter itself apart."""
    program = job.program
    assert program is not None and program.pid is not None
    pids = proof.process_tree([program.pid], children)
    if not lease.client_gone and program.client_pid is not None:
        pids |= proof.process_tree([program.client_pid], children) - {program.client_pid}
    return pids
