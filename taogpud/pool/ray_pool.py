"""The Ray executor: one warm worker per configured device as a Ray actor, anywhere in a cluster.

The daemon keeps what it owns with the local executor — admission, the queue, the caps,
affinity, the store, the traces — and this pool stands where `supervisor.WorkerPool` stands,
behind the same interface (interface.py) and the same messages: a RunJob becomes an actor
call, its result a JobFinished for the scheduler.

    ray.init ─(connect_timeout_s)─► actors created (num_gpus, max_concurrency = stream_count)
      └─ warm_info ─(ready_timeout_s)─► warm ─► run / cancel / ping ─► lost ─► replaced (backoff)

Data: each uploaded input array is put into Ray's object store once (from its /dev/shm image,
while any running job uses it) and fetched by the actor — zero-copy when it shares the node.
Kept outputs come back as arrays in the call's return value and are written here to
state/outputs/<job>/<name>.npy: each byte crosses the daemon once, into the file. On a local
instance, a client's own memory (the `.shm` socket) reaches the actors as it reaches local
workers: the actor maps it through /proc and writes the outputs in place, no store involved.

Faults: ray.init and actor readiness have timeouts (an unreachable cluster is a clear error,
never a hang; ray.init runs in a daemon thread, which a timeout leaves behind). An actor that
dies — its process killed, its node lost — fails its running jobs as a local worker's crash
does (`worker_crashed`, or a retry when the job allows), and is replaced with the local
pool's backoff. A monitor pings the actors and asks the GCS for the nodes every few seconds;
what it finds is `problem()`, shown by status and doctor.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayError

from taogpud.arrayfiles.images import ArrayRef
from taogpud.backends.base import DeviceInfo, WorkerSpec
from taogpud.backends.cpu import blas_thread_env
from taogpud.config import RaySection
from taogpud.errors import BackendUnavailable
from taogpud.host.environ import without_secrets
from taogpud.memfd.regions import RegionRef
from taogpud.observability.logging import get_logger
from taogpud.pool import protocol as msg
from taogpud.pool.execute import STICKY_ERROR_CODES
from taogpud.pool.interface import PoolSink, WorkerState
from taogpud.pool.ray_actor import CONTROL, WorkerActor
from taogpud.pool.ray_calls import KeeperThread, first_line, in_daemon_thread, wait_ref
from taogpud.pool.ray_data import InputCache, failed, keep_outputs
from taogpud.pool.supervisor import next_respawn_delay

MONITOR_EVERY_S = 2.0
MONITOR_TIMEOUT_S = 5.0
SHUTDOWN_TIMEOUT_S = 15.0
# Ray ends a driver whose GCS has not answered for 60 s (gcs_rpc_server_reconnect_timeout_s):
# the daemon would die with its cluster's head. It stays up instead, and says so in status.
GCS_RECONNECT_ENV = "RAY_gcs_rpc_server_reconnect_timeout_s"
GCS_RECONNECT_S = 365 * 86400

log = get_logger("taogpud.pool")
_ray_untyped: Any = ray  # a few of Ray's state calls carry no annotations


class RayWorker:
    """The daemon's handle of one actor: what the scheduler reads of a worker (interface.Worker)."""

    def __init__(self, spec: WorkerSpec, pool: RayWorkerPool) -> None:
        self.spec = spec
        self.state = WorkerState.dead
        self.info: DeviceInfo | None = None
        self.pid: int | None = None  # the actor's process, on its node
        self.running: set[str] = set()
        self.reserved_bytes = 0
        self.jobs_done = 0
        self.restarts = 0
        self.crash_streak = 0  # see supervisor.next_respawn_delay
        self.warm_at: float | None = None
        self.warm_failure: str | None = None
        self.retired = False
        self.actor: Any = None
        self.death: str | None = None  # why the last actor ended
        self._pool = pool

    @property
    def label(self) -> str:
        return self.info.device if self.info else f"{self.spec.backend}:{self.spec.index}"

    @property
    def node(self) -> str | None:
        return None if self.info is None else self.info.extra.get("hostname")

    @property
    def free_slots(self) -> int:
        if self.state is not WorkerState.warm:
            return 0
        return self.spec.stream_count - len(self.running)

    def send(self, order: msg.ToWorker) -> None:
        if self.actor is None:
            raise BrokenPipeError(f"worker {self.label} has no actor")
        if isinstance(order, msg.RunJob):
            self._pool.run(self, order)
        elif isinstance(order, msg.CancelJob):
            self.actor.cancel.remote(order.job_id)
        elif isinstance(order, msg.SetMemoryFraction):
            self._pool.set_fraction(self, order.fraction)

    def kill(self) -> None:
        if self.actor is not None:
            ray.kill(self.actor, no_restart=True)  # its calls fail: the pool sees it lost

    def exit_description(self) -> str:
        return self.death or "still running"


class RayWorkerPool:
    executor = "ray"

    def __init__(self, specs: list[WorkerSpec], settings: RaySection) -> None:
        self.workers = [RayWorker(spec, self) for spec in specs]
        self.settings = settings
        self._sink: PoolSink | None = None  # given to start(): nothing reports before it
        self._stopping = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._inputs = InputCache()
        self._problem: str | None = None
        self._keeper = KeeperThread()
        self._nodes_query: asyncio.Future[list[dict[str, Any]]] | None = None
        self.gcs_lost = False  # the last question to the GCS went unanswered
        self._nodes_alive = 0

    # -- lifecycle ------------------------------------------------------------------------

    @property
    def _told(self) -> PoolSink:
        assert self._sink is not None, "a worker reported before the pool was started"
        return self._sink

    async def start(self, sink: PoolSink, warm_timeout_s: float) -> None:
        """Connect, check the cluster can hold every actor, and return once all are warm.
        From now on the workers' news goes to `sink` (the scheduler)."""
        self._sink = sink
        await self._connect()
        self._check_resources()
        timeout_s = min(warm_timeout_s, self.settings.ready_timeout_s)
        await asyncio.gather(*(self._start_worker(w, timeout_s) for w in self.workers))
        failed = [w for w in self.workers if w.state is not WorkerState.warm]
        if failed:
            reasons = "; ".join(f"{w.label}: {w.warm_failure}" for w in failed)
            raise BackendUnavailable(
                f"a Ray worker failed to warm up: {reasons}",
                "check `ray status` and the actor's log on its node (ray logs)",
            )
        self._spawn(self._monitor())

    async def _connect(self) -> None:
        address = self.settings.address
        kwargs: dict[str, Any] = {
            "namespace": self.settings.namespace,
            "log_to_driver": False,
            "logging_level": logging.WARNING,
        }
        if address == "local":  # a private instance, a child of this daemon
            kwargs.update(include_dashboard=False, num_gpus=self.settings.local_num_gpus)
            kwargs.update(num_cpus=self.settings.local_num_cpus)
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # a daemon does not phone home
        else:
            kwargs["address"] = address
        timeout_s = self.settings.connect_timeout_s
        os.environ.setdefault(GCS_RECONNECT_ENV, str(GCS_RECONNECT_S))
        try:
            # A local Ray's processes (and the actors they start) are children of the daemon:
            # none gets the key. Only at start, before the API serves: nothing else of the
            # daemon reads its environment while ray.init runs.
            with without_secrets():
                await self._keeper.start(lambda: ray.init(**kwargs), timeout_s)
        except TimeoutError:
            raise BackendUnavailable(
                f"the Ray cluster at ray.address = {address!r} did not answer within "
                f"{timeout_s:g} s",
                "check that the head node runs (`ray status` there) and that its GCS port is "
                "reachable from this host, or raise ray.connect_timeout_s",
            ) from None
        except (ConnectionError, RayError, RuntimeError, ValueError) as exc:
            raise BackendUnavailable(
                f"cannot connect to the Ray cluster at ray.address = {address!r}: "
                f"{first_line(exc)}",
                'start a cluster (`ray start --head`), point ray.address at it, or use "local"',
            ) from None
        log.info("ray.connected", address=address, namespace=self.settings.namespace)

    def _check_resources(self) -> None:
        """Refuse at once what Ray would leave pending for ever: more GPUs than the cluster has."""
        total: dict[str, float] = _ray_untyped.cluster_resources()
        wanted = {"GPU": self.settings.worker_num_gpus, "CPU": self.settings.worker_num_cpus}
        wanted.update(self.settings.worker_resources)
        for name, each in wanted.items():
            need = each * len(self.workers)
            if need > total.get(name, 0.0) + 1e-9:
                key = {"GPU": "worker_num_gpus", "CPU": "worker_num_cpus"}.get(
                    name, f"worker_resources.{name}"
                )
                raise BackendUnavailable(
                    f"the Ray cluster has {total.get(name, 0.0):g} {name} in all; "
                    f"{len(self.workers)} workers × ray.{key} = {each:g} need {need:g}",
                    "add nodes, list fewer devices, or ask less per worker in [ray]",
                )

    async def stop(self, timeout_s: float) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        if self.gcs_lost:
            # ray.shutdown without a GCS aborts the process before the store is closed; a
            # local instance's processes end with this one anyway, a cluster's actors with
            # their owner. Ray's core worker would still abort at exit (SIGABRT after
            # daemon.stopped), so the daemon leaves by os._exit: see exit_hooks_safe.
            log.warning("ray.shutdown_skipped", reason=self._problem)
            return
        for worker in self.workers:
            worker.state = WorkerState.stopping
            worker.kill()
        try:
            await in_daemon_thread(ray.shutdown, min(timeout_s, SHUTDOWN_TIMEOUT_S))
        except TimeoutError:
            log.warning("ray.shutdown_timeout", timeout_s=timeout_s)
        self._keeper.release()

    @property
    def exit_hooks_safe(self) -> bool:
        """Never, with Ray: without its GCS its exit hooks abort the process (a stop systemd
        would call failed), and on a busy host they were seen to abort after a clean
        ray.shutdown too (SIGABRT after daemon.stopped). The daemon skips them once the
        store is closed and its output flushed; ray.shutdown has already ended what it ran."""
        return False

    def kill_all(self) -> None:
        for worker in self.workers:
            if worker.actor is not None and ray.is_initialized():
                worker.kill()
        if ray.is_initialized():
            ray.shutdown()
        self._keeper.release()

    @property
    def healthy(self) -> list[RayWorker]:
        return [w for w in self.workers if w.state is WorkerState.warm]

    def problem(self) -> str | None:
        return self._problem

    # -- one actor ------------------------------------------------------------------------

    async def _start_worker(self, worker: RayWorker, timeout_s: float) -> None:
        worker.state, worker.info, worker.warm_failure = WorkerState.starting, None, None
        worker.actor = self._new_actor(worker)
        try:
            info, pid, failure, frozen = await wait_ref(worker.actor.warm_info.remote(), timeout_s)
        except TimeoutError:
            failure = f"not placed and warm within {timeout_s:g} s ({self._pending_reason()})"
            info, pid, frozen = None, None, 0
        except RayError as exc:
            failure = f"the actor died while warming: {first_line(exc)}"
            info, pid, frozen = None, None, 0
        if failure or info is None:
            worker.warm_failure = failure
            worker.kill()
            worker.state = WorkerState.dead
            log.error("worker.warm_failed", device=worker.label, error=failure)
            return
        worker.info, worker.pid, worker.state = info, pid, WorkerState.warm
        worker.warm_at = time.monotonic()
        log.info(
            "worker.warm",
            device=worker.label,
            pid=pid,
            frozen_objects=frozen,
            backend=info.backend,
            warmup_ms=round(info.warmup_ms, 1),
            name=info.name,
            node_id=info.extra.get("node_id"),
            node_hostname=info.extra.get("hostname"),
        )

    def _new_actor(self, worker: RayWorker) -> Any:
        spec, settings = worker.spec, self.settings
        env = {**blas_thread_env(spec.thread_num), "CUDA_DEVICE_ORDER": "PCI_BUS_ID"}
        remote: Any = _ray_untyped.remote(concurrency_groups={CONTROL: 1})(WorkerActor)
        return remote.options(
            name=f"taogpud-{spec.backend}{spec.index}-{os.getpid()}-{worker.restarts}",
            num_gpus=settings.worker_num_gpus,
            num_cpus=settings.worker_num_cpus,
            resources=dict(settings.worker_resources),
            max_concurrency=spec.stream_count,
            max_restarts=0,  # the pool replaces it, so it knows its jobs were lost
            runtime_env={"env_vars": env},
        ).remote(spec)

    def _pending_reason(self) -> str:
        try:
            free: dict[str, float] = _ray_untyped.available_resources()
        except RayError as exc:
            return f"the cluster does not answer: {first_line(exc)}"
        shown = ", ".join(f"{k} {v:g}" for k, v in sorted(free.items()) if "node:" not in k)
        return f"free in the cluster now: {shown or 'nothing'}"

    def _lost(self, worker: RayWorker, actor: Any, reason: str) -> None:
        """The actor `actor` ended: fail (or retry) its jobs and start a new one after a backoff."""
        if actor is not worker.actor or worker.state is WorkerState.dead or self._stopping:
            return  # already handled, a retired one, or the pool is stopping
        worker.state, worker.death = WorkerState.dead, reason
        log.error(
            "worker.lost", device=worker.label, pid=worker.pid, exit=reason,
            jobs_lost=len(worker.running),
        )  # fmt: skip
        self._told.on_worker_lost(worker)
        self._spawn(self._respawn(worker))

    async def _respawn(self, worker: RayWorker) -> None:
        while not self._stopping and worker.state is WorkerState.dead and not worker.retired:
            delay = next_respawn_delay(worker)
            log.warning("worker.respawn", device=worker.label, in_s=delay, restarts=worker.restarts)
            await asyncio.sleep(delay)
            if self._stopping:
                return
            await self._start_worker(worker, self.settings.ready_timeout_s)
        if worker.state is WorkerState.warm:
            self._told.on_worker_warm(worker)

    # -- jobs -----------------------------------------------------------------------------

    def run(self, worker: RayWorker, order: msg.RunJob) -> None:
        self._spawn(self._run(worker, worker.actor, order))

    async def _run(self, worker: RayWorker, actor: Any, order: msg.RunJob) -> None:
        try:
            refs = await self._inputs.acquire(_uploads(order))
        except Exception as exc:  # the object store is full or gone: this job's error
            refs, finished = None, failed(order.job_id, exc)
        if refs is not None:
            try:
                finished = await self._call(actor, order, refs)
            except RayActorError as exc:
                self._lost(worker, actor, f"the Ray actor died: {first_line(exc)}")
                return
            except Exception as exc:  # the object store, a full disk: this job's error
                finished = failed(order.job_id, exc)
            finally:
                self._inputs.release(_uploads(order))
        if actor is worker.actor and order.job_id in worker.running:
            self._told.on_job_finished(worker, finished)
        if finished.error is not None and finished.error[0] in STICKY_ERROR_CODES:
            # the actor's CUDA context is unusable for good: replace it, as a local worker
            # exits (its other jobs fail worker_crashed, or are retried)
            self._lost(worker, actor, "an unrecoverable device error made the actor unusable")
            ray.kill(actor, no_restart=True)

    async def _call(self, actor: Any, order: msg.RunJob, refs: dict[str, Any]) -> msg.JobFinished:
        """The job on the actor; its kept outputs written here, into the state directory."""
        call = actor.run.remote(_regions_only(order), refs)
        finished, kept = await wait_ref(call, None)
        if kept and order.output_dir:
            finished = await asyncio.to_thread(keep_outputs, finished, kept, order.output_dir)
        return finished  # type: ignore[no-any-return]

    def set_fraction(self, worker: RayWorker, fraction: float) -> None:
        async def apply() -> None:
            with contextlib.suppress(RayError):
                info = await wait_ref(worker.actor.set_memory_fraction.remote(fraction), 30.0)
                if info is not None:
                    worker.info = info

        self._spawn(apply())

    def set_memory_fraction(self, fraction: float) -> None:
        for worker in self.healthy:
            worker.send(msg.SetMemoryFraction(fraction))

    # -- health ---------------------------------------------------------------------------

    async def unresponsive(self, timeout_s: float) -> list[RayWorker]:
        warm = self.healthy
        answers = await asyncio.gather(*(self._ping(w, timeout_s) for w in warm))
        return [w for w, answered in zip(warm, answers, strict=True) if not answered]

    async def _ping(self, worker: RayWorker, timeout_s: float) -> bool:
        actor = worker.actor
        try:
            await wait_ref(actor.ping.remote(), timeout_s)
        except TimeoutError:
            return False
        except RayActorError as exc:
            self._lost(worker, actor, f"the Ray actor died: {first_line(exc)}")
            return False
        except RayError:
            return False
        return True

    async def _monitor(self) -> None:
        """Find dead actors while they are idle, and whether the cluster still answers."""
        while not self._stopping:
            await asyncio.sleep(MONITOR_EVERY_S)
            await self.unresponsive(MONITOR_TIMEOUT_S)
            await self._ask_gcs()

    async def _ask_gcs(self) -> None:
        """The nodes, from the GCS. One question at a time: one that hangs (a lost head node)
        is waited for again at the next tick, not asked again in one more thread."""
        if self._nodes_query is None:
            self._nodes_query = asyncio.ensure_future(in_daemon_thread(ray.nodes, None))
        try:
            async with asyncio.timeout(MONITOR_TIMEOUT_S):
                nodes = await asyncio.shield(self._nodes_query)
        except TimeoutError:
            self.gcs_lost = True
            self._set_problem(
                f"the Ray cluster at {self.settings.address!r} does not answer: no reply from "
                f"its GCS within {MONITOR_TIMEOUT_S:g} s (head node down or unreachable)"
            )
            return
        except (RayError, ConnectionError) as exc:
            self._nodes_query = None
            self._set_problem(f"the Ray cluster does not answer: {first_line(exc)}")
            return
        self._nodes_query, self.gcs_lost = None, False
        self._nodes_alive = sum(1 for node in nodes if node.get("Alive"))
        dead = [w for w in self.workers if w.state is WorkerState.dead]
        self._set_problem(
            "; ".join(f"{w.label}: {w.warm_failure or w.death}" for w in dead) or None
        )

    def _set_problem(self, problem: str | None) -> None:
        if problem != self._problem:
            (log.error if problem else log.info)("ray.cluster", problem=problem)
        self._problem = problem

    def cluster_view(self) -> dict[str, Any]:
        return {
            "address": self.settings.address,
            "namespace": self.settings.namespace,
            "connected": ray.is_initialized(),
            "nodes_alive": self._nodes_alive,
            "problem": self._problem,
        }

    # -- rolling restarts (a reload changed a worker key) --------------------------------

    async def roll(self, specs: list[WorkerSpec], warm_timeout_s: float) -> list[str]:
        """New actors from `specs`, one device at a time, each old one drained first."""
        wanted = {spec.index for spec in specs}
        for worker in [w for w in self.workers if w.spec.index not in wanted]:
            await self._retire(worker)
            self.workers.remove(worker)
        problems = []
        for spec in specs:
            old = next((w for w in self.workers if w.spec.index == spec.index), None)
            if old is not None:
                await self._retire(old)
            fresh = RayWorker(spec, self)
            if old is not None:
                self.workers[self.workers.index(old)] = fresh
            else:
                self.workers.append(fresh)
                self.workers.sort(key=lambda w: w.spec.index)
            await self._start_worker(fresh, min(warm_timeout_s, self.settings.ready_timeout_s))
            if fresh.state is WorkerState.warm:
                self._told.on_worker_warm(fresh)
            else:
                problems.append(f"{fresh.label}: {fresh.warm_failure}")
                self._spawn(self._respawn(fresh))
        return problems

    async def _retire(self, worker: RayWorker) -> None:
        worker.retired, worker.state = True, WorkerState.stopping
        while worker.running:
            await asyncio.sleep(0.02)
        worker.kill()

    def _spawn(self, coroutine: Any) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _uploads(order: msg.RunJob) -> dict[str, ArrayRef]:
    """The job's uploaded inputs: these go through the object store. The others are regions
    of a client's own memory, which reach only a local instance's actors (the `.shm` socket
    is served with ray.address = "local" alone): they stay in the order, and the actor maps
    them through /proc as a local worker does (ray_actor.ObjectStoreIO)."""
    return {name: ref for name, ref in order.inputs.items() if isinstance(ref, ArrayRef)}


def _regions_only(order: msg.RunJob) -> msg.RunJob:
    """The order as the actor gets it: uploads travel beside it, as object refs."""
    kept: dict[str, ArrayRef | RegionRef] = {
        name: ref for name, ref in order.inputs.items() if not isinstance(ref, ArrayRef)
    }
    return dataclasses.replace(order, inputs=kept)
