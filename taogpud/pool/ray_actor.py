"""One warm worker as a Ray actor: the local worker's backend, warm-up, slots and `execute`.

The actor is what `child.worker_main` is for a spawned process, minus the pipe: Ray
delivers the orders. Its environment (BLAS threads, CUDA_DEVICE_ORDER) comes from the
actor's runtime_env, set before the process starts, because BLAS and CUDA read it when they
load. Ray sets CUDA_VISIBLE_DEVICES to the GPU it granted, so inside the actor that GPU is
CUDA device 0; the DeviceInfo still names the daemon's device index (gpu:N) and adds the
node (id and hostname) and Ray's GPU ids.

Jobs run on the default concurrency group (max_concurrency = stream_count threads, one slot
each); ping, cancel and the memory cap run on their own "control" thread, so a busy actor
still answers them.

Data: uploaded inputs arrive as object refs (put once by the daemon) and are fetched here (no
copy on the daemon's node); the kept outputs go back as arrays in the call's return value,
through the object store, and the daemon writes them to its state directory. Inputs in a
client's own memory (a local instance only) stay in the order as regions: mapped here through
/proc/<daemon pid>/fd/<n> with the inode check, kept mapped across jobs, outputs written in
place (pool/regions.py), exactly as in a local worker.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import socket
import threading
from typing import Any

import ray

from taogpud.backends.base import Backend, DeviceInfo, WorkerSpec
from taogpud.host import heap
from taogpud.memfd import pinning
from taogpud.pool import protocol as msg
from taogpud.pool.cancels import Cancels
from taogpud.pool.execute import OUTPUT_NAME, execute, map_input

CONTROL = "control"  # the concurrency group of ping, cancel and set_memory_fraction


class WorkerActor:
    """Decorated by the pool with ray.remote (num_gpus, max_concurrency, runtime_env)."""

    def __init__(self, spec: WorkerSpec) -> None:
        from taogpud.observability import logging as tlog

        tlog.configure()
        self.spec = spec
        self.failure: str | None = None  # why warm-up failed; the pool reads it, then kills us
        self.info: DeviceInfo | None = None
        self.backend: Backend | None = None
        self._cancels = Cancels()
        self._slot_numbers = itertools.count()
        self._local = threading.local()
        self.frozen_objects = 0  # start-up's objects frozen out of GC scans, once warm
        try:
            self._warm()
        except Exception as exc:  # reported, not raised: the pool decides, as for a process
            self.failure = f"{type(exc).__name__}: {exc}"
        else:
            self.frozen_objects = heap.freeze_start_up()  # as a local worker (pool/child.py)

    def _warm(self) -> None:
        from taogpud.tasks.warmup import backend_for, warm

        # the one GPU Ray granted is device 0 in here; cpu devices keep their number
        local = (
            dataclasses.replace(self.spec, index=0) if self.spec.backend == "cuda" else self.spec
        )
        self.backend = backend_for(local)
        info = warm(self.backend)
        pinning.install(self.backend.host_pinning())  # as in a local worker (pool/child.py)
        context = ray.get_runtime_context()
        node = {
            "node_id": context.get_node_id(),
            "hostname": socket.gethostname(),
            "ray_gpu_ids": [str(gpu) for gpu in ray.get_gpu_ids()],
            "ray_actor_id": context.get_actor_id(),
        }
        device = f"gpu:{self.spec.index}" if self.spec.backend == "cuda" else info.device
        self.info = dataclasses.replace(
            info, device=device, index=self.spec.index, extra={**info.extra, **node}
        )

    def warm_info(self) -> tuple[DeviceInfo | None, int, str | None, int]:
        """(info, pid, failure, frozen objects): what Warm / WarmFailed carry for a process."""
        return self.info, os.getpid(), self.failure, self.frozen_objects

    def run(
        self, order: msg.RunJob, inputs: dict[str, ray.ObjectRef[Any]]
    ) -> tuple[msg.JobFinished, dict[str, Any]]:
        """One job on this thread's slot: (its JobFinished, the kept outputs as arrays)."""
        assert self.backend is not None and self.info is not None  # only warm actors get jobs
        fetched = ray.get(list(inputs.values())) if inputs else []
        io = ObjectStoreIO(dict(zip(inputs, fetched, strict=True)))
        cancelled = self._cancels.open(order.job_id)
        try:
            finished = execute(self.backend, self.info, order, cancelled, self._slot(), io)
        finally:
            self._cancels.close(order.job_id)
        return finished, io.kept if finished.status == "succeeded" else {}

    @ray.method(concurrency_group=CONTROL)
    def cancel(self, job_id: str) -> None:
        self._cancels.cancel(job_id)  # the run call may not have started yet

    @ray.method(concurrency_group=CONTROL)
    def ping(self) -> int:
        return os.getpid()

    @ray.method(concurrency_group=CONTROL)
    def set_memory_fraction(self, fraction: float) -> DeviceInfo | None:
        if self.backend is None or self.info is None:
            return None
        self.backend.set_memory_fraction(fraction)
        cap = int(self.info.memory_total_bytes * fraction)
        self.info = dataclasses.replace(self.info, memory_cap_bytes=cap)
        return self.info

    def _slot(self) -> int:
        # the default group's threads are fixed: each takes a slot (a CUDA stream) for good
        slot: int | None = getattr(self._local, "slot", None)
        if slot is None:
            slot = self._local.slot = next(self._slot_numbers)
        return slot


class ObjectStoreIO:
    """`execute`'s inputs and outputs for an actor: arrays in, arrays out (no files)."""

    def __init__(self, inputs: dict[str, Any]) -> None:
        self.inputs = inputs
        self.kept: dict[str, Any] = {}

    def host_inputs(self, order: msg.RunJob, maps: list[Any]) -> dict[str, Any]:
        """The fetched uploads, and the regions of a client's memory mapped here (a local
        instance's actor is a process of the daemon's uid on its host, as a worker is)."""
        mapped = {name: map_input(ref, maps) for name, ref in order.inputs.items()}
        return {**self.inputs, **mapped}

    def keep_outputs(
        self, backend: Backend, arrays: dict[str, Any], output_dir: str
    ) -> dict[str, msg.OutputFile]:
        import numpy as np

        found = {}
        for name, array in arrays.items():
            if not OUTPUT_NAME.fullmatch(name):
                raise ValueError(
                    f"output name {name!r} is not allowed (letters, digits, _ . - only)"
                )
            host = np.asarray(backend.to_host(array), order="C")
            self.kept[name] = host
            found[name] = msg.OutputFile(name, tuple(host.shape), host.dtype.str, host.nbytes)
        return found
