"""The daemon's start-time checks of a cuda config against the cards NVML sees.

Run once CUDA itself answered (backends/cuda/backend.py: probe_cuda), before any worker is spawned:

- `cuda_arch` against every configured card's compute capability ("auto" takes each card's);
  a mismatch refuses to start (or falls back, when allowed), naming the value to use;
- `memory.pool_size_mb` above memoryFraction × total: an error (the pool could never be
  pre-allocated);
- memoryFraction × total above what is free now: a warning naming who holds the rest.

`startup_findings` is a pure function of an `nvml.Inventory`: tests feed one in.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from taogpud.backends.cuda.kernels import same_arch
from taogpud.errors import BackendUnavailable
from taogpud.observability import nvml
from taogpud.observability.logging import get_logger

if TYPE_CHECKING:
    from taogpud.config import ConfigSnapshot

log = get_logger("taogpud.startup")

MIB = 2**20
GIB = 2**30


@dataclass(frozen=True)
class Finding:
    kind: Literal["arch", "pool_size", "memory"]
    message: str
    hint: str


@dataclass(frozen=True)
class StartupFindings:
    errors: list[Finding] = field(default_factory=list)  # the daemon must not start on cuda
    warnings: list[Finding] = field(default_factory=list)  # logged at WARN, start goes on

    def of_kind(self, kind: str) -> list[Finding]:
        return [f for f in (*self.errors, *self.warnings) if f.kind == kind]


def startup_findings(
    inventory: nvml.Inventory,
    indices: Sequence[int],
    visible: str | None,
    cuda_arch: str,
    memory_fraction: float,
    pool_size_mb: int,
    own_pids: frozenset[int] = frozenset(),
) -> StartupFindings:
    """What is wrong with starting cuda workers on `indices` (CUDA's numbering)."""
    cards = nvml.cuda_order(inventory, visible)
    found = [(index, cards[index]) for index in indices if 0 <= index < len(cards)]
    errors = [*_arch_findings(found, cuda_arch)]
    errors += [f for _, card in found for f in _pool_findings(card, memory_fraction, pool_size_mb)]
    warnings = [
        w for index, card in found for w in _memory_findings(index, card, memory_fraction, own_pids)
    ]
    return StartupFindings(errors, warnings)


def _arch_findings(found: list[tuple[int, nvml.GpuDevice]], cuda_arch: str) -> list[Finding]:
    if cuda_arch == "auto":
        return []
    wrong = [
        (index, card) for index, card in found if card.arch and not same_arch(cuda_arch, card.arch)
    ]
    if not wrong:
        return []
    arches = sorted({card.arch for _, card in found if card.arch})
    fix = arches[0] if len(arches) == 1 else "auto"
    cards = "; ".join(
        f"gpu:{index} ({card.name}) has compute capability {card.compute_capability} ({card.arch})"
        for index, card in wrong
    )
    return [
        Finding(
            "arch",
            f'config.toml: backend.cuda.cuda_arch is "{cuda_arch}" but {cards}',
            f'set cuda_arch = "{fix}" under [backend.cuda] in config.toml'
            + ("" if fix == "auto" else ' (or "auto")'),
        )
    ]


def _pool_findings(card: nvml.GpuDevice, fraction: float, pool_size_mb: int) -> list[Finding]:
    cap = math.floor(card.memory_total_bytes * fraction)
    if pool_size_mb * MIB <= cap:
        return []
    cap_mb = cap // MIB
    return [
        Finding(
            "pool_size",
            f"config.toml: memory.pool_size_mb is {pool_size_mb} but the cap on {card.name} "
            f"is {cap_mb} MiB (gpu.memoryFraction {fraction:g} × "
            f"{card.memory_total_bytes // MIB} MiB)",
            f"set memory.pool_size_mb to {cap_mb} or less, or raise gpu.memoryFraction",
        )
    ]


def _memory_findings(
    index: int, card: nvml.GpuDevice, fraction: float, own_pids: frozenset[int]
) -> list[Finding]:
    total = card.memory_total_bytes
    cap = math.floor(total * fraction)
    ours = sum(p.used_bytes or 0 for p in card.processes if p.pid in own_pids)
    usable = card.memory_free_bytes + ours
    if cap <= usable:
        return []
    others = [p for p in card.processes if p.pid not in own_pids]
    holders = ", ".join(_holder(p) for p in others) if others else "no process NVML can name"
    fits = usable / total if total else 0.0
    return [
        Finding(
            "memory",
            f"gpu:{index}: memoryFraction {fraction:g} × {_gib(total)} = {_gib(cap)} but only "
            f"{_gib(usable)} is free now; held by {holders}",
            f"free that memory, or lower gpu.memoryFraction to {math.floor(fits * 100) / 100:g} "
            "or less; until then jobs that do not fit what is free wait in the queue",
        )
    ]


def _holder(process: nvml.GpuProcess) -> str:
    used = _gib(process.used_bytes) if process.used_bytes is not None else "? GiB"
    return f"pid {process.pid}{f' ({process.name})' if process.name else ''} {used}"


def _gib(nbytes: float) -> str:
    return f"{nbytes / GIB:.1f} GiB"


def check_at_start(snapshot: ConfigSnapshot, indices: Sequence[int]) -> str | None:
    """Run the checks on this host's cards: log the warnings, raise on a pool that can never
    fit, and return the arch mismatch as the reason CUDA cannot start (None when all is well).

    Without NVML (no nvidia-ml-py) nothing is checked here; each worker still compares the
    arch with what CUDA reports before it warms."""
    inventory = nvml.inventory()
    if not inventory.available:
        log.warning("startup.nvml_unavailable", reason=inventory.reason)
        return None
    findings = startup_findings(
        inventory,
        indices,
        os.environ.get("CUDA_VISIBLE_DEVICES"),
        snapshot.config.backend.cuda.cuda_arch,
        snapshot.settings.gpu.memory_fraction,
        snapshot.config.memory.pool_size_mb,
        own_pids=_our_workers(inventory),
    )
    for warning in findings.warnings:
        log.warning("gpu.memory_short", problem=warning.message, hint=warning.hint)
    for error in findings.of_kind("pool_size"):
        raise BackendUnavailable(error.message, error.hint)
    arch = findings.of_kind("arch")
    return f"{arch[0].message}: {arch[0].hint}" if arch else None


def _our_workers(inventory: nvml.Inventory) -> frozenset[int]:
    """The GPU processes that are this daemon's own workers (on a reload that rolls them,
    their memory is ours, not another's)."""
    pids = {process.pid for card in inventory.devices for process in card.processes}
    return frozenset(pid for pid in pids if parent_pid(pid) == os.getpid())


def parent_pid(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # "pid (comm) state ppid ...": comm may hold spaces and parentheses, so split after it
    fields = stat.rpartition(")")[2].split()
    return int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
