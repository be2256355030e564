"""Device memory of one OpenCL device: a buffer cache per slot, all counted against one cap.

Each slot allocates from its own pyopencl MemoryPool on its own in-order queue, so a block a
job let go is reused by that slot's next job without a new clCreateBuffer (on PoCL a fresh
400 MB buffer costs 0.15–0.6 s of page faults here; bench/opencl.py measures it). A block is only
ever reused on the queue that freed it: an in-order queue runs the next job's commands after
the last job's, so no kernel still reads it.

The cap is memoryFraction × the device's global memory, over every byte the pools hold,
cached blocks included (they occupy the device as much as live ones). An allocation that
would pass it first makes every pool give its cached blocks back; if it still does not fit,
it raises DeviceMemoryCapExceeded (a MemoryError) and the job fails `out_of_device_memory`.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol

from taogpud.errors import DeviceMemoryCapExceeded


class Pool(Protocol):
    """What the budget needs of a pool (pyopencl.tools.MemoryPool has exactly this)."""

    @property
    def managed_bytes(self) -> int: ...  # live and cached blocks together
    @property
    def active_bytes(self) -> int: ...  # blocks in use by arrays now
    def free_held(self) -> None: ...


class DeviceMemoryBudget:
    """One device's cap over all its slots' pools. Allocations take its lock, so two slots
    never both see the same room."""

    def __init__(self, cap_bytes: int, max_alloc_bytes: int) -> None:
        self.cap_bytes = cap_bytes
        self.max_alloc_bytes = max_alloc_bytes  # CL_DEVICE_MAX_MEM_ALLOC_SIZE
        self.pools: list[Pool] = []
        self.lock = threading.Lock()

    def held_bytes(self) -> int:
        return sum(pool.managed_bytes for pool in self.pools)

    def admit(self, block_bytes: int, requested: int) -> None:
        """Raise unless a new block of block_bytes fits under the cap; call with `lock` held."""
        if requested > self.max_alloc_bytes:
            raise DeviceMemoryCapExceeded(
                f"one buffer of {mib(requested)} is larger than the device's largest single "
                f"allocation ({mib(self.max_alloc_bytes)}, CL_DEVICE_MAX_MEM_ALLOC_SIZE)"
            )
        if self.held_bytes() + block_bytes <= self.cap_bytes:
            return
        self.give_back_cached()
        in_use = self.held_bytes()
        if in_use + block_bytes > self.cap_bytes:
            raise DeviceMemoryCapExceeded(
                f"allocating {mib(requested)} with {mib(in_use)} in use would pass the cap of "
                f"{mib(self.cap_bytes)}"
            )

    def give_back_cached(self) -> None:
        for pool in self.pools:
            pool.free_held()


class SlotAllocator:
    """pyopencl's allocator protocol (bytes → buffer) for one slot: its pool, the cap checked."""

    def __init__(self, queue: Any, budget: DeviceMemoryBudget) -> None:
        from pyopencl.tools import ImmediateAllocator, MemoryPool

        # Immediate: the driver commits the memory now, so a shortage fails here, not later.
        self.pool = MemoryPool(ImmediateAllocator(queue))
        self.budget = budget
        budget.pools.append(self.pool)

    def __call__(self, size: int) -> Any:
        with self.budget.lock:
            block = self.pool.alloc_size(self.pool.bin_number(size))
            self.budget.admit(block, size)
            return self.pool.allocate(size)


def mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:,.1f} MiB"
