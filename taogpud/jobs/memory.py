"""A job whose inputs and output are in a client's own memory (memfd/server.py) rather than
in the array store: its regions, and what to do once it ends."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from taogpud.memfd.regions import RegionRef


@dataclass
class JobRegions:
    """A job's inputs and output span in a client's memory, and what to do once it ends."""

    inputs: dict[str, RegionRef]
    output: RegionRef | None
    handover: str  # "shared": the client's memory for the connection; "sealed": frozen input
    release: Callable[[], None] = lambda: None

    def input_bytes(self) -> int:
        return sum(ref.nbytes for ref in self.inputs.values())

    def record(self) -> dict[str, Any]:
        return {"handover": self.handover, "bytes": self.input_bytes()}
