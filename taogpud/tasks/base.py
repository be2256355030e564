"""What a task is: a params model, a memory estimate, and one body over `xp`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

from pydantic import BaseModel

from taogpud.errors import JobCancelled


class OutputPlaces(Protocol):
    """Where outputs may be written in place (pool/regions.py's OutputSpace): the client's
    own memory, on the shared-memory path of a backend that computes in host memory."""

    def claim(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any | None:
        """A writable array for output `name` there, or None where it does not fit."""
        ...


@dataclass
class TaskContext:
    """What a task body may use. Inputs are already on the device (xp arrays)."""

    xp: ModuleType
    backend: str  # "cpu" | "cuda"
    device: str  # "cpu:0" | "gpu:0"
    inputs: Mapping[str, Any]
    cancelled: threading.Event
    info: Mapping[str, Any] = field(default_factory=dict)  # the worker's DeviceInfo as a dict
    runtime: Any = None  # Backend.task_runtime(): opencl's queue, allocator and kernels
    places: OutputPlaces | None = None  # None: every output is a new array

    def output(self, name: str, shape: tuple[int, ...], dtype: Any) -> Any:
        """The array to compute output `name` into (numpy's `out=`), returned under the same
        name in TaskOutput.arrays: a view of the client's memory where the job has one and
        the backend computes in host memory, so no copy follows; else a new `xp.empty`.
        A task that makes its outputs otherwise still works: they are copied in afterwards."""
        if self.places is not None:
            place = self.places.claim(name, tuple(shape), self.xp.dtype(dtype))
            if place is not None:
                return place
        return self.xp.empty(shape, dtype)

    def check_cancelled(self) -> None:
        if self.cancelled.is_set():
            raise JobCancelled


@dataclass
class TaskOutput:
    """A task's answer: a small JSON summary, and arrays the caller may keep."""

    summary: dict[str, Any]
    arrays: dict[str, Any] = field(default_factory=dict)  # xp arrays; moved to host by the worker


@dataclass(frozen=True)
class Task:
    name: str
    description: str
    params: type[BaseModel]
    body: Callable[[TaskContext, Any], TaskOutput]
    estimate_bytes: Callable[[Any], int]  # device memory the params will need (admission)
    inputs: tuple[str, ...] = ()  # array names the task accepts instead of generating them
    backends: frozenset[str] = frozenset({"cpu", "cuda"})
    # bodies for one backend that replace `body` there (opencl: tasks/opencl_kernels.py)
    backend_bodies: Mapping[str, Callable[[TaskContext, Any], TaskOutput]] = field(
        default_factory=dict
    )

    def body_for(self, backend: str) -> Callable[[TaskContext, Any], TaskOutput]:
        """The body that runs on `backend`; UnsupportedTask where the task has none."""
        if backend not in self.backends:
            from taogpud.errors import UnsupportedTask

            raise UnsupportedTask(
                f"{self.name} has no {backend} implementation (it runs on "
                f"{', '.join(sorted(self.backends))}), and taogpud never runs a job on another "
                "device than the one configured",
                f"submit it to a daemon whose gpu.backend is one of "
                f"{', '.join(sorted(self.backends))}; `taogpuctl tasks` lists each task's backends",
            )
        return self.backend_bodies.get(backend, self.body)

    def catalog_entry(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": self.params.model_json_schema(),
            "inputs": list(self.inputs),
            "backends": sorted(self.backends),
        }
