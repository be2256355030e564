"""The worker process: pick the device, warm the backend, run jobs on its slots.

Spawned, never forked (CUDA and OpenCL do not survive a fork). The environment
is set before numpy or cupy is imported, because BLAS reads its thread count and
CUDA its device order when they load.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import threading
from multiprocessing.connection import Connection

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.backends.cpu import blas_thread_env
from taogpud.host import heap
from taogpud.memfd import pinning
from taogpud.pool import protocol as msg
from taogpud.pool.cancels import Cancels
from taogpud.pool.execute import STICKY_ERROR_CODES, execute


def worker_main(spec: WorkerSpec, control: Connection, slots: list[Connection]) -> None:
    """Entry point of a spawned worker; returns when the daemon says stop or goes away."""
    _prepare_environment(spec)
    from taogpud.observability import logging as tlog
    from taogpud.tasks.warmup import backend_for, warm

    tlog.configure()
    tlog.keep_stdout_for_lines()  # a task's print goes to stderr, never among the JSON lines
    log = tlog.get_logger("taogpud.worker").bind(pid=os.getpid(), device_index=spec.index)
    backend = backend_for(spec)
    try:
        info = warm(backend)
    except Exception as exc:  # any failure to warm is reported, not raised: the daemon decides
        log.error("worker.warm_failed", error=f"{type(exc).__name__}: {exc}")
        msg.send(control, msg.WarmFailed(f"{type(exc).__name__}: {exc}"))
        return
    pinning.install(backend.host_pinning())  # cuda: client memory it maps becomes pinned
    Runner(backend, info, control, slots).serve()


def _prepare_environment(spec: WorkerSpec) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the daemon decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(blas_thread_env(spec.thread_num))
    # NVML and CUDA must number GPUs alike, or jobs land on one GPU while reported on another.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


class Runner:
    """The control pipe on the main thread; each slot a thread reading a pipe of its own.

    A job comes down its slot's pipe and runs on the thread that read it, and its result goes
    back up the same pipe: no hand-off between threads. With one reader thread passing jobs
    to a thread pool, that hand-off cost 70–85 µs of a tiny job's 0.7 ms (bench/run.py).
    """

    def __init__(
        self, backend: Backend, info: DeviceInfo, control: Connection, slots: list[Connection]
    ) -> None:
        self.backend = backend
        self.info = info
        self.control = control
        self.slots = slots
        # One message at a time leaves this process: a device error's exit (below) never
        # cuts another slot's result off halfway down its pipe.
        self._send_lock = threading.Lock()
        self._cancels = Cancels()

    def serve(self) -> None:
        threads = [
            threading.Thread(target=self._serve_slot, args=(n, conn), name=f"slot{n}")
            for n, conn in enumerate(self.slots)
        ]
        for thread in threads:
            thread.start()
        frozen = heap.freeze_start_up()  # warm: the backend and every task ran once
        self.send(self.control, msg.Warm(self.info, os.getpid(), frozen))
        while not isinstance(order := _receive(self.control), msg.Stop):
            self._handle(order)
        for thread in threads:  # each reads Stop on its own pipe after the jobs sent before it
            thread.join()

    def _handle(self, order: msg.ToWorker) -> None:
        if isinstance(order, msg.CancelJob):
            self._cancels.cancel(order.job_id)
        elif isinstance(order, msg.SetMemoryFraction):
            self._set_memory_fraction(order.fraction)
        elif isinstance(order, msg.Ping):
            self.send(self.control, msg.Pong(order.token))

    def _set_memory_fraction(self, fraction: float) -> None:
        self.backend.set_memory_fraction(fraction)
        cap = int(self.info.memory_total_bytes * fraction)
        self.info = dataclasses.replace(self.info, memory_cap_bytes=cap)
        self.send(self.control, msg.InfoUpdated(self.info))

    def send(self, conn: Connection, message: msg.FromWorker) -> None:
        with self._send_lock:
            msg.send(conn, message)

    def _serve_slot(self, slot: int, conn: Connection) -> None:
        while isinstance(order := _receive(conn), msg.RunJob):
            self._run(slot, conn, order)

    def _run(self, slot: int, conn: Connection, order: msg.RunJob) -> None:
        cancelled = self._cancels.open(order.job_id)
        try:
            finished = execute(self.backend, self.info, order, cancelled, slot)
        finally:
            self._cancels.close(order.job_id)
        self.send(conn, finished)
        if finished.error is not None and finished.error[0] in STICKY_ERROR_CODES:
            # The CUDA context is unusable for good: leave, so the pool spawns a clean worker.
            with self._send_lock:
                os._exit(msg.EXIT_DEVICE_UNUSABLE)


def _receive(conn: Connection) -> msg.ToWorker:
    try:
        order: msg.ToWorker = msg.receive(conn)
    except (EOFError, OSError):
        os._exit(0)  # the daemon is gone: nobody can receive a result
    return order
