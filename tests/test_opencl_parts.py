"""The opencl backend's parts that need no daemon: the memory budget, the probe's verdicts,
the device-lost rule, and which tasks have an OpenCL body.

OpenCL itself is only ever used in child processes here (a process that used OpenCL must
not fork, and pytest's may).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from taogpud import tasks
from taogpud.backends.opencl import probe as opencl_probe
from taogpud.backends.opencl.backend import device_lost
from taogpud.backends.opencl.memory import DeviceMemoryBudget
from taogpud.backends.opencl.probe import (
    OpenclDevice,
    OpenclInventory,
    OpenclPlatform,
    inventory,
    problem,
)
from taogpud.backends.opencl.report import opencl_document, rows
from taogpud.doctor.opencl import check_opencl
from taogpud.errors import DeviceMemoryCapExceeded, UnsupportedTask

MIB = 2**20


class CountingPool:
    """A real fake of pyopencl's MemoryPool as the budget sees it: bytes live and cached."""

    def __init__(self, active: int = 0, held: int = 0) -> None:
        self.active_bytes, self.held = active, held

    @property
    def managed_bytes(self) -> int:
        return self.active_bytes + self.held

    def free_held(self) -> None:
        self.held = 0


def test_cached_blocks_go_back_before_a_job_is_refused() -> None:
    """Over the cap only because of cached blocks: every pool gives them back, and it fits."""
    budget = DeviceMemoryBudget(cap_bytes=10 * MIB, max_alloc_bytes=8 * MIB)
    first, second = CountingPool(active=2 * MIB, held=4 * MIB), CountingPool(held=3 * MIB)
    budget.pools += [first, second]
    budget.admit(6 * MIB, 6 * MIB)
    assert (first.held, second.held) == (0, 0)


def test_live_blocks_past_the_cap_refuse_with_the_numbers() -> None:
    """Live bytes + the new block past the cap: DeviceMemoryCapExceeded, a MemoryError."""
    budget = DeviceMemoryBudget(cap_bytes=10 * MIB, max_alloc_bytes=8 * MIB)
    budget.pools.append(CountingPool(active=6 * MIB, held=1 * MIB))
    with pytest.raises(MemoryError, match=r"allocating 5\.0 MiB with 6\.0 MiB in use"):
        budget.admit(5 * MIB, 5 * MIB)
    with pytest.raises(DeviceMemoryCapExceeded, match=r"cap of 10\.0 MiB"):
        budget.admit(5 * MIB, 5 * MIB)


def test_one_buffer_above_the_device_limit_is_out_of_memory() -> None:
    """A single buffer past CL_DEVICE_MAX_MEM_ALLOC_SIZE fails as a MemoryError, with the limit."""
    budget = DeviceMemoryBudget(cap_bytes=100 * MIB, max_alloc_bytes=8 * MIB)
    with pytest.raises(MemoryError, match="largest single allocation"):
        budget.admit(16 * MIB, 9 * MIB)


def _host(*device_counts: int) -> OpenclInventory:
    def devices(count: int) -> tuple[OpenclDevice, ...]:
        return tuple(
            OpenclDevice(i, "gfx1100", "GPU", "AMD", "OpenCL 2.0", 16 * 2**30, 4 * 2**30, True)
            for i in range(count)
        )

    platforms = tuple(
        OpenclPlatform(index, f"platform{index}", "v", "OpenCL 3.0", devices(count))
        for index, count in enumerate(device_counts)
    )
    return OpenclInventory(platforms)


def test_probe_verdicts_name_the_key_and_what_exists() -> None:
    """No platform, a platform_index or a device_index that does not exist: one sentence each."""
    assert problem(_host(2), 0, [0, 1]) is None
    assert problem(_host(2), 0, "all") is None
    assert "finds no platform" in (problem(OpenclInventory(), 0, [0]) or "")
    wrong_platform = problem(_host(1, 3), 2, [0]) or ""
    assert "platform_index is 2" in wrong_platform and "1: platform1" in wrong_platform
    wrong_device = problem(_host(2), 0, [0, 3]) or ""
    assert "asks for device 3" in wrong_device and "has 2 device(s)" in wrong_device
    assert problem(OpenclInventory(reason="pyopencl is not installed"), 0, [0]) == (
        "pyopencl is not installed"
    )


class _ClError(Exception):
    """Stands in for pyopencl.Error, which carries the OpenCL status as `code`."""

    def __init__(self, code: int) -> None:
        super().__init__(f"status {code}")
        self.code = code


def test_device_lost_is_told_from_a_job_error() -> None:
    """DEVICE_NOT_AVAILABLE and a dead queue mean a new worker; out of resources does not."""
    assert "DEVICE_NOT_AVAILABLE" in (device_lost(_ClError(-2)) or "")
    assert "INVALID_COMMAND_QUEUE" in (device_lost(_ClError(-36)) or "")
    assert device_lost(_ClError(-5)) is None
    assert device_lost(ValueError("not OpenCL")) is None


def test_tasks_without_an_opencl_body_are_refused() -> None:
    """fft has no OpenCL body: body_for says so and names where it runs; the kernels and the
    device-free tasks (noop, sleep) are marked for opencl."""
    catalog = {task.name: task for task in tasks.all_tasks()}
    for name in ("vector_add", "saxpy", "matmul", "reduce_sum", "sort", "probe", "noop", "sleep"):
        assert "opencl" in catalog[name].backends, name
    assert catalog["vector_add"].body_for("opencl") is not catalog["vector_add"].body
    assert catalog["sleep"].body_for("opencl") is catalog["sleep"].body
    with pytest.raises(UnsupportedTask, match="fft has no opencl implementation"):
        catalog["fft"].body_for("opencl")


@pytest.mark.process
def test_a_missing_linker_is_a_reason_not_a_crash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without `ld` on PATH PoCL aborts the process that builds a kernel: the probe's child
    dies of SIGABRT and the daemon gets a sentence saying to install binutils."""
    if not inventory().platforms:
        pytest.skip("needs an OpenCL platform (PoCL)")
    monkeypatch.setenv("PATH", str(tmp_path))  # no ld, and a cold cache so PoCL must link
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path / "pocl"))
    found = inventory(build_on=(0, [0]))
    assert found.reason is not None
    assert "SIGABRT" in found.reason and "install binutils" in found.reason


def test_devices_and_doctor_show_opencl_beside_cuda() -> None:
    """`devices` marks the device a worker holds; doctor fails a missing configured device on
    an opencl config, passes a present one, and only lists OpenCL for another backend."""
    host = _host(2)
    workers = [{"backend": "opencl", "platform_index": 0, "index": 1, "device": "opencl:1"}]
    document = opencl_document(host, workers)
    assert document["status"] == "ok"
    assert [d["worker"] for d in document["platforms"][0]["devices"]] == [None, "opencl:1"]
    assert rows(document)[1][:4] == [0, 1, "GPU", "gfx1100"]
    assert check_opencl("opencl", 0, [0, 1], host).status == "pass"
    missing = check_opencl("opencl", 0, [4], host)
    assert missing.status == "fail" and "asks for device 4" in missing.detail
    assert "clinfo -l" in missing.hint
    other = check_opencl("cuda", 0, [0], host)
    assert (
        other.status == "skip"
        and "platform 0 platform0: 0 gfx1100 (GPU), 1 gfx1100" in other.detail
    )
    nothing = opencl_document(OpenclInventory(reason="pyopencl is not installed"), None)
    assert nothing["status"] == "pyopencl is not installed" and nothing["platforms"] == []


def test_a_probe_that_cannot_start_is_a_reason_not_an_exception(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """inventory() never raises: a child that cannot even be started (here, no interpreter at
    sys.executable) is OpenCL unavailable, with why."""
    pytest.importorskip("pyopencl")
    monkeypatch.setattr(opencl_probe.sys, "executable", str(tmp_path / "no-python"))
    found = opencl_probe.inventory()
    assert not found.available
    assert found.reason is not None and "could not start" in found.reason
