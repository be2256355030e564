"""The worker process: pick the device, warm the backend, run jobs on its slots.

Spawned, never forked (CUDA and OpenCL do not survive a fork). The environment
is set before numpy or cupy is imported, because BLAS reads its thread count and
CUDA its device order when they load.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.backends.cpu import blas_thread_env
from taogpud.pool import protocol as msg
from taogpud.pool.execute import STICKY_ERROR_CODES, execute


def worker_main(spec: WorkerSpec, conn: Connection) -> None:
    """Entry point of a spawned worker; returns when the daemon says stop or goes away."""
    _prepare_environment(spec)
    from taogpud import logging as tlog
    from taogpud.backends import create_backend

    tlog.configure()
    log = tlog.get_logger("taogpud.worker").bind(pid=os.getpid(), device_index=spec.index)
    backend = create_backend(spec)
    try:
        info = backend.warm()
    except Exception as exc:  # any failure to warm is reported, not raised: the daemon decides
        log.error("worker.warm_failed", error=f"{type(exc).__name__}: {exc}")
        conn.send(msg.WarmFailed(f"{type(exc).__name__}: {exc}"))
        return
    Runner(backend, info, conn).serve()


def _prepare_environment(spec: WorkerSpec) -> None:
    # Ctrl-C in a terminal reaches the whole process group; the daemon decides when we stop.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    os.environ.update(blas_thread_env(spec.thread_num))
    # NVML and CUDA must number GPUs alike, or jobs land on one GPU while reported on another.
    os.environ["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"


class Runner:
    """Reads orders from the pipe; each job runs on one of stream_count slot threads."""

    def __init__(self, backend: Backend, info: DeviceInfo, conn: Connection) -> None:
        self.backend = backend
        self.info = info
        self.conn = conn
        self._send_lock = threading.Lock()
        self._cancel_events: dict[str, threading.Event] = {}
        self._slot_numbers = itertools.count()
        self._local = threading.local()
        self._slots = ThreadPoolExecutor(
            max_workers=backend.spec.stream_count,
            thread_name_prefix="slot",
            initializer=self._claim_slot,
        )

    def serve(self) -> None:
        self.send(msg.Warm(self.info, os.getpid()))
        while True:
            try:
                order = self.conn.recv()
            except (EOFError, OSError):
                os._exit(0)  # the daemon is gone: nobody can receive a result
            if isinstance(order, msg.Stop):
                break
            self._handle(order)
        self._slots.shutdown(wait=True)

    def _handle(self, order: msg.ToWorker) -> None:
        if isinstance(order, msg.RunJob):
            self._cancel_events[order.job_id] = threading.Event()
            self._slots.submit(self._run, order)
        elif isinstance(order, msg.CancelJob):
            event = self._cancel_events.get(order.job_id)
            if event is not None:
                event.set()
        elif isinstance(order, msg.SetMemoryFraction):
            self._set_memory_fraction(order.fraction)
        elif isinstance(order, msg.Ping):
            self.send(msg.Pong(order.token))

    def _set_memory_fraction(self, fraction: float) -> None:
        self.backend.set_memory_fraction(fraction)
        cap = int(self.info.memory_total_bytes * fraction)
        self.info = dataclasses.replace(self.info, memory_cap_bytes=cap)
        self.send(msg.InfoUpdated(self.info))

    def send(self, message: msg.FromWorker) -> None:
        with self._send_lock:
            self.conn.send(message)

    def _claim_slot(self) -> None:
        self._local.slot = next(self._slot_numbers)

    def _run(self, order: msg.RunJob) -> None:
        cancelled = self._cancel_events[order.job_id]
        try:
            finished = execute(self.backend, self.info, order, cancelled, self._local.slot)
        finally:
            self._cancel_events.pop(order.job_id, None)
        self.send(finished)
        if finished.error is not None and finished.error[0] in STICKY_ERROR_CODES:
            # The CUDA context is unusable for good: leave, so the pool spawns a clean worker.
            # Under the send lock, so no other slot's message is cut off halfway down the pipe.
            with self._send_lock:
                os._exit(msg.EXIT_DEVICE_UNUSABLE)
