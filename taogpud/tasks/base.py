"""What a task is: a params model, a memory estimate, and one body over `xp`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from pydantic import BaseModel


class JobCancelled(Exception):
    """Raised inside a task body when its job was cancelled or timed out."""


@dataclass
class TaskContext:
    """What a task body may use. Inputs are already on the device (xp arrays)."""

    xp: ModuleType
    backend: str  # "cpu" | "cuda"
    device: str  # "cpu:0" | "gpu:0"
    inputs: Mapping[str, Any]
    cancelled: threading.Event
    info: Mapping[str, Any] = field(default_factory=dict)  # the worker's DeviceInfo as a dict

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

    def catalog_entry(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "params": self.params.model_json_schema(),
            "inputs": list(self.inputs),
            "backends": sorted(self.backends),
        }
