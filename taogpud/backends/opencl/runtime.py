"""What one OpenCL slot holds while a job runs on it, and the device facts every trace repeats.

Imported only inside an opencl worker: it imports pyopencl at the top. The kernels a slot
holds are built by the tasks layer (tasks/opencl_kernels.py) and handed to the backend when
it is created (`OpenclBackend(spec, slot_kernels)`): the backend owns the context, the
queues and the memory; it never imports the tasks that run on them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pyopencl as cl
import pyopencl.array as cla

from taogpud.backends.opencl.probe import device_type_name

# Given the context, the device and the slot count, one set of built kernels per slot. Every
# kernel object is per slot: a pyopencl kernel sets its arguments and then enqueues, so two
# slot threads must never share one.
SlotKernels = Callable[[cl.Context, cl.Device, int], list[Any]]


@dataclass
class SlotRuntime:
    """What an OpenCL task body uses: the slot's queue, its capped allocator, its kernels."""

    context: cl.Context
    queue: cl.CommandQueue
    allocator: Any  # size → cl.Buffer, counted against the device's memory cap
    kernels: Any  # what SlotKernels built for this slot; None when none were given

    def empty(self, shape: tuple[int, ...], dtype: Any) -> cla.Array:
        return cla.empty(self.queue, shape, dtype, allocator=self.allocator)

    def to_dtype(self, array: cla.Array, dtype: Any) -> cla.Array:
        if array.dtype == dtype:
            return array
        converted: cla.Array = array.astype(dtype)  # through the array's own capped allocator
        return converted


def has_fp64(device: cl.Device) -> bool:
    """Whether the device does double precision (cl_khr_fp64)."""
    return "cl_khr_fp64" in device.extensions


def device_facts(device: cl.Device) -> dict[str, Any]:
    """What a job trace repeats about the OpenCL device: its type, name, vendor, platform."""
    return {
        "device_type": device_type_name(cl, device.type),
        "device_name": device.name.strip(),
        "device_vendor": device.vendor.strip(),
        "platform": device.platform.name.strip(),
    }
