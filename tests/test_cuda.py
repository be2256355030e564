"""The CUDA backend's parts that run without a GPU: NVRTC builds for cuda_arch, the start-time
checks and the NVML evidence on fed data, sticky errors, the kernel cache directory, and the
`kernel` task's gate. What needs a GPU is in tests/test_gpu.py.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest

from taogpud.backends.base import PhaseClock, WorkerSpec
from taogpud.backends.cpu import CpuBackend
from taogpud.backends.cuda.backend import sticky_cuda_error
from taogpud.backends.cuda.evidence import (
    JobWindow,
    UtilizationSampler,
    job_evidence,
    normalise_bus_id,
)
from taogpud.backends.cuda.kernels import compile_cubin, resolve_arch
from taogpud.backends.cuda.samples import SAMPLES
from taogpud.backends.cuda.startup import check_at_start, parent_pid, startup_findings
from taogpud.cli.devices import devices_document, gpu_rows, header_lines, process_lines
from taogpud.client import ApiError
from taogpud.errors import KernelCompileError
from taogpud.host.paths import kernel_cache_env
from taogpud.observability import nvml
from taogpud.pool import protocol as msg
from taogpud.pool.child import Runner
from taogpud.tasks import validate_params
from taogpud.tasks.kernel import KERNEL_TASK
from taogpud.testing import wait_until

CUDARuntimeError = pytest.importorskip("cupy.cuda.runtime").CUDARuntimeError  # CuPy: cuda extra
GIB = 2**30
CUBIN_MAGIC = b"\x7fELF"

# ---------------------------------------------------------------------------- NVRTC


@pytest.mark.parametrize("arch", ["sm_89", "sm_90", "sm_90a", resolve_arch("auto", "8.0")])
@pytest.mark.parametrize("name", sorted(SAMPLES))
def test_every_shipped_kernel_compiles_for_the_arch(name: str, arch: str) -> None:
    """Each CUDA C sample taogpud ships builds to a cubin (an ELF file) for the arch asked."""
    cubin = compile_cubin(SAMPLES[name], arch)
    assert cubin.startswith(CUBIN_MAGIC)


def test_a_user_kernel_compiles_for_the_configured_arch() -> None:
    """A client's kernel builds for cuda_arch as configured, no GPU needed."""
    source = 'extern "C" __global__ void twice(float* x) { x[threadIdx.x] *= 2.0f; }'
    assert compile_cubin(source, "sm_89").startswith(CUBIN_MAGIC)


def test_an_arch_nvrtc_does_not_know_names_the_ones_it_does() -> None:
    """sm_999 fails with the archs this NVRTC can build and how to set one."""
    with pytest.raises(KernelCompileError) as caught:
        compile_cubin(SAMPLES["saxpy"], "sm_999")
    assert "sm_999" in caught.value.message
    assert "sm_90" in caught.value.hint and "cuda_arch" in caught.value.hint
    assert caught.value.code == "kernel_compile_failed"


def test_a_malformed_arch_is_refused_before_nvrtc() -> None:
    """'90' (no sm_) is refused, saying the form to use."""
    with pytest.raises(KernelCompileError, match="not an architecture"):
        compile_cubin(SAMPLES["saxpy"], "90")


def test_a_source_that_does_not_compile_carries_the_compiler_log() -> None:
    """A syntax error fails with NVRTC's own words (the line and what is wrong)."""
    with pytest.raises(KernelCompileError) as caught:
        compile_cubin('extern "C" __global__ void broken(float* x) { x[0] = ; }', "sm_89")
    assert "does not compile for sm_89" in caught.value.message
    assert "error" in caught.value.message


def test_auto_takes_the_cards_capability() -> None:
    """cuda_arch "auto" on a 9.0 card builds for sm_90; a set value is kept as it is."""
    assert resolve_arch("auto", "9.0") == "sm_90"
    assert resolve_arch("sm_89", "9.0") == "sm_89"


# ---------------------------------------------------------------------------- kernel params


def kernel_params(**overrides: Any) -> dict[str, Any]:
    return {
        "source": SAMPLES["saxpy"],
        "name": "saxpy",
        "grid": [4],
        "block": [256],
        "args": [
            {"input": "x0"},
            {"input": "x1"},
            {"output": "out", "shape": [1024], "dtype": "float32"},
            {"scalar": 2.0, "dtype": "float32"},
            {"scalar": 1024, "dtype": "int32"},
        ],
        **overrides,
    }


def test_kernel_params_accept_inputs_outputs_and_scalars() -> None:
    """The saxpy example validates; its estimate counts the output it allocates."""
    params = validate_params(KERNEL_TASK, kernel_params())
    assert KERNEL_TASK.estimate_bytes(params) == 1024 * 4


@pytest.mark.parametrize(
    ("overrides", "said"),
    [
        ({"block": [64, 32]}, "2048 threads; CUDA allows 1024"),
        ({"grid": [0]}, "grid.0"),
        ({"name": "not a name"}, "name"),
        ({"args": [{"input": "y9"}]}, "args.0"),
        (
            {"args": [{"output": "o", "shape": [1]}, {"output": "o", "shape": [2]}]},
            "o given twice",
        ),
        ({"args": [{"scalar": 2.5, "dtype": "int32"}]}, "not a whole number"),
    ],
)
def test_bad_kernel_params_say_what_is_wrong(overrides: dict[str, Any], said: str) -> None:
    """Too many threads, an empty grid, a bad name, an unknown input, twice the same output,
    a fraction for an integer."""
    from taogpud.errors import InvalidParams

    with pytest.raises(InvalidParams) as caught:
        validate_params(KERNEL_TASK, kernel_params(**overrides))
    assert said in caught.value.message


# ---------------------------------------------------------------------------- the gate


def test_the_kernel_task_is_off_unless_the_config_allows_it(
    daemon_factory: Callable[..., Any],
) -> None:
    """Default config: submitting `kernel` is task_disabled (403), naming the key to set."""
    daemon = daemon_factory()
    with daemon.client() as client, pytest.raises(ApiError) as caught:
        client.submit("kernel", kernel_params())
    assert caught.value.code == "task_disabled"
    assert "allow_user_kernels = true" in caught.value.hint


def test_an_allowed_kernel_on_cpu_workers_is_refused_as_cuda_only(
    daemon_factory: Callable[..., Any],
) -> None:
    """allow_user_kernels on a cpu daemon: past the gate, then refused: kernel runs on cuda."""
    daemon = daemon_factory(config={"backend": {"cuda": {"allow_user_kernels": True}}})
    with daemon.client() as client, pytest.raises(ApiError) as caught:
        client.submit("kernel", kernel_params(args=[]))
    assert caught.value.code == "unsupported_task"
    assert "cuda" in caught.value.message


# ---------------------------------------------------------------------------- start-time checks


def card(
    index: int,
    capability: str = "9.0",
    total: int = 80 * GIB,
    free: int = 80 * GIB,
    processes: tuple[nvml.GpuProcess, ...] = (),
) -> nvml.GpuDevice:
    return nvml.GpuDevice(
        index=index,
        name="NVIDIA H100",
        uuid=f"GPU-0000000{index}-aaaa-bbbb-cccc-dddddddddddd",
        pci_bus_id=f"00000000:{17 + index:02X}:00.0",
        compute_capability=capability,
        memory_total_bytes=total,
        memory_free_bytes=free,
        memory_used_bytes=total - free,
        utilization_percent=3,
        processes=processes,
    )


def inventory(*cards: nvml.GpuDevice) -> nvml.Inventory:
    return nvml.Inventory(devices=cards, driver_version="580.65.06", cuda_driver_version="13.0")


def findings(inv: nvml.Inventory, **overrides: Any) -> Any:
    args: dict[str, Any] = {
        "indices": [0],
        "visible": None,
        "cuda_arch": "sm_90",
        "memory_fraction": 0.85,
        "pool_size_mb": 4096,
        **overrides,
    }
    return startup_findings(inv, **args)


def test_matching_arch_and_enough_memory_find_nothing() -> None:
    """sm_90 on a 9.0 card with its memory free: no error, no warning."""
    found = findings(inventory(card(0)))
    assert found.errors == [] and found.warnings == []


def test_an_arch_mismatch_names_the_value_to_use() -> None:
    """The seed's sm_89 on a 9.0 card is an error whose fix is cuda_arch = "sm_90"."""
    found = findings(inventory(card(0)), cuda_arch="sm_89")
    (error,) = found.errors
    assert error.kind == "arch"
    assert "compute capability 9.0" in error.message
    assert 'cuda_arch = "sm_90"' in error.hint


def test_an_arch_specific_variant_counts_as_the_cards_arch() -> None:
    """sm_90a (Hopper's own features) on a 9.0 card is no mismatch; on an 8.9 card it is."""
    assert findings(inventory(card(0)), cuda_arch="sm_90a").errors == []
    assert findings(inventory(card(0, "8.9")), cuda_arch="sm_90a").errors != []


def test_auto_passes_and_mixed_cards_are_told_to_use_auto() -> None:
    """ "auto" takes each card's; a fixed arch over 8.9 and 9.0 cards is told to use "auto"."""
    mixed = inventory(card(0, "8.9"), card(1, "9.0"))
    assert findings(mixed, indices=[0, 1], cuda_arch="auto").errors == []
    (error,) = findings(mixed, indices=[0, 1], cuda_arch="sm_89").errors
    assert 'cuda_arch = "auto"' in error.hint and "gpu:1" in error.message


def test_the_arch_check_follows_cuda_visible_devices() -> None:
    """CUDA_VISIBLE_DEVICES=1 makes NVML's card 1 CUDA's device 0: that card is compared."""
    mixed = inventory(card(0, "8.9"), card(1, "9.0"))
    assert findings(mixed, visible="1", cuda_arch="sm_90").errors == []


def test_a_pool_larger_than_the_cap_is_an_error_with_the_largest_that_fits() -> None:
    """pool_size_mb 80000 on an 80 GiB card at 0.85 is an error naming 69632 MiB."""
    (error,) = findings(inventory(card(0)), pool_size_mb=80_000).errors
    assert error.kind == "pool_size"
    assert "69632" in error.hint


def test_memory_held_by_others_is_a_warning_naming_them() -> None:
    """30 GiB free of 80 at 0.85: a warning naming pid 4242 (python) and the fraction that fits."""
    holder = nvml.GpuProcess(pid=4242, used_bytes=50 * GIB, name="python")
    found = findings(inventory(card(0, free=30 * GIB, processes=(holder,))))
    assert found.errors == []
    (warning,) = found.warnings
    assert "pid 4242 (python) 50.0 GiB" in warning.message
    assert "0.37" in warning.hint


def test_the_daemons_start_check_refuses_a_pool_and_reports_an_arch(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """check_at_start on fed cards: a pool over the cap raises; an arch mismatch is the
    reason CUDA cannot start (the plan then refuses or falls back); NVML absent: no verdict."""
    from taogpud import config
    from taogpud.errors import BackendUnavailable

    (tmp_path / "config.toml").write_text("[memory]\npool_size_mb = 200000\n")
    (tmp_path / "settings.json").write_text("{}")
    snapshot = config.load(tmp_path / "settings.json", tmp_path / "config.toml", environ={})
    monkeypatch.setattr(nvml, "inventory", lambda: inventory(card(0)))
    with pytest.raises(BackendUnavailable, match="pool_size_mb is 200000"):
        check_at_start(snapshot, [0])
    (tmp_path / "config.toml").write_text("[memory]\npool_size_mb = 4096\n")  # seed: sm_89
    seed = config.load(tmp_path / "settings.json", tmp_path / "config.toml", environ={})
    assert 'set cuda_arch = "sm_90"' in str(check_at_start(seed, [0]))
    monkeypatch.setattr(nvml, "inventory", lambda: nvml.Inventory(reason="no driver"))
    assert check_at_start(seed, [0]) is None


def test_our_own_workers_memory_is_not_counted_as_anothers() -> None:
    """A reload's check: 50 GiB held by our worker (own_pids) is usable, so no warning."""
    worker = nvml.GpuProcess(pid=4242, used_bytes=50 * GIB, name="python3")
    inv = inventory(card(0, free=30 * GIB, processes=(worker,)))
    assert findings(inv, own_pids=frozenset({4242})).warnings == []


def test_the_parent_of_a_process_is_read_from_proc() -> None:
    """parent_pid tells this daemon's children (its workers) from other processes."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        assert parent_pid(child.pid) == os.getpid()
    finally:
        child.kill()
        child.wait()
    assert parent_pid(2**22 + 1) is None  # above pid_max: no such process


# ---------------------------------------------------------------------------- NVML evidence


def window(*samples: int, span_s: float = 2.0) -> JobWindow:
    """A finished job's window that ran span_s (longer than NVML's window by default)."""
    now = time.monotonic()
    seen = JobWindow(started_s=now - span_s, ended_s=now)
    for sample in samples:
        seen.add(sample)
    return seen


UUID = "GPU-00000000-aaaa-bbbb-cccc-dddddddddddd"


def test_evidence_confirms_a_job_nvml_saw_on_its_gpu() -> None:
    """Worker pid listed on the GPU whose UUID CUDA gave: confirmed, with the utilisation peak."""
    evidence = job_evidence(
        worker_pid=77,
        cuda_uuid=UUID,
        nvml_uuid=UUID,
        pci_bus_id="0000:17:00.0",
        gpu_pids=[12, 77],
        window=window(0, 93, 40),
    )
    assert evidence["verdict"] == "confirmed"
    assert evidence["pid_seen_on_gpu"] and evidence["uuid_matches_cuda"]
    assert evidence["utilization_peak_percent"] == 93
    assert evidence["utilization_samples"] == 3
    assert evidence["gpu_pids"] == [12, 77]


def test_evidence_says_when_the_pid_is_not_seen() -> None:
    """Pid missing (a container's pid namespace): pid_not_seen, with a note saying why."""
    evidence = job_evidence(
        worker_pid=77,
        cuda_uuid=UUID,
        nvml_uuid=UUID,
        pci_bus_id=None,
        gpu_pids=[9],
        window=window(),
    )
    assert evidence["verdict"] == "pid_not_seen"
    assert "container" in evidence["note"]
    assert evidence["utilization_peak_percent"] is None


def test_evidence_flags_cuda_and_nvml_disagreeing() -> None:
    """NVML's card on the bus id has another UUID: uuid_mismatch, naming both."""
    other = UUID.replace("0000000", "1111111")
    evidence = job_evidence(
        worker_pid=77,
        cuda_uuid=UUID,
        nvml_uuid=other,
        pci_bus_id=None,
        gpu_pids=[77],
        window=window(),
    )
    assert evidence["verdict"] == "uuid_mismatch"
    assert UUID in evidence["note"] and other in evidence["note"]


def confirmed(seen: JobWindow) -> dict[str, Any]:
    return job_evidence(
        worker_pid=77,
        cuda_uuid=UUID,
        nvml_uuid=UUID,
        pci_bus_id=None,
        gpu_pids=[77],
        window=seen,
    )


def test_evidence_records_nvmls_sample_window_beside_the_peak() -> None:
    """A 2 s job: its peak, how long it ran, and the 1/6-1 s window NVML averages over."""
    evidence = confirmed(window(0, 88, span_s=2.0))
    assert evidence["utilization_peak_percent"] == 88
    assert evidence["utilization_window_s"] == [0.167, 1.0]
    assert evidence["job_span_s"] == pytest.approx(2.0, abs=0.01)
    assert "utilization_note" not in evidence


def test_a_job_shorter_than_the_window_is_too_short_to_sample_not_zero() -> None:
    """A 40 ms job that read 0 %: 'too short to sample', with its span, never 0."""
    evidence = confirmed(window(0, 0, span_s=0.04))
    assert evidence["utilization_peak_percent"] == "too short to sample"
    assert "40.0 ms" in evidence["utilization_note"]
    busy = confirmed(window(0, 35, span_s=0.04))  # a short job NVML did see busy keeps it
    assert busy["utilization_peak_percent"] == 35


def test_the_energy_is_the_devices_counter_delta_shared_by_overlapping_jobs() -> None:
    """Fed counter readings: each job gets its own delta; overlapping ones say they share it."""
    counter = iter([1_000, 1_500, 4_000, 9_000, 20_000, 30_000])  # mJ, as NVML counts
    sampler = UtilizationSampler(lambda: 50, period_s=10, read_energy_mj=lambda: next(counter))
    alone = sampler.begin()  # 1_000
    sampler.end(alone)  # 1_500
    first = sampler.begin()  # 4_000
    second = sampler.begin()  # 9_000: overlaps the first
    sampler.end(first)  # 20_000
    sampler.end(second)  # 30_000
    assert confirmed(alone)["energy_j"] == 0.5
    assert confirmed(alone)["energy_overlapping_jobs"] == 0
    one, two = confirmed(first), confirmed(second)
    assert (one["energy_j"], two["energy_j"]) == (16.0, 21.0)
    assert one["energy_overlapping_jobs"] == two["energy_overlapping_jobs"] == 1
    assert "overlapped" in one["energy_note"] and "share" in one["energy_note"]


def test_no_energy_counter_gives_no_energy_figure() -> None:
    """A GPU whose NVML has no energy counter (or a failing read): energy_j is None."""

    def broken() -> int:
        raise RuntimeError("NVML: Not Supported")

    sampler = UtilizationSampler(lambda: 50, period_s=10, read_energy_mj=broken)
    job = sampler.begin()
    sampler.end(job)
    assert confirmed(job)["energy_j"] is None


def test_bus_ids_of_nvml_and_cuda_compare_equal() -> None:
    """NVML's 8-digit domain and CUDA's 4-digit one name the same slot."""
    assert normalise_bus_id("00000000:17:00.0") == normalise_bus_id("0000:17:00.0")
    assert normalise_bus_id("00000000:C1:00.0") == "0000:c1:00.0"


def test_the_sampler_runs_only_while_jobs_run_and_keeps_each_jobs_peak() -> None:
    """Two overlapping windows both see the samples; the thread ends with the last window."""
    readings = itertools.cycle([10, 60, 30])
    sampler = UtilizationSampler(lambda: next(readings), period_s=0.001)
    assert not sampler.running
    first = sampler.begin()
    second = sampler.begin()
    wait_until(lambda: first.samples >= 5 and second.samples >= 5, "five samples each")
    sampler.end(first)
    assert sampler.running  # the second job still runs
    sampler.end(second)
    wait_until(lambda: not sampler.running, "the sampler thread to stop")
    assert first.peak_percent == 60 and second.peak_percent == 60


def test_a_failing_reader_leaves_the_job_without_samples() -> None:
    """NVML raising mid-job costs the samples, never the job."""

    def broken() -> int:
        raise RuntimeError("NVML went away")

    sampler = UtilizationSampler(broken, period_s=0.001)
    seen = sampler.end(sampler.begin())
    assert seen.samples == 0 and seen.peak_percent is None


# ---------------------------------------------------------------------------- sticky errors


def test_an_illegal_address_is_sticky_and_an_allocation_failure_is_not() -> None:
    """CUDA 700 (illegal address) is sticky, also when wrapped; 2 (out of memory) is not."""
    assert "illegal memory access" in str(sticky_cuda_error(CUDARuntimeError(700)))
    try:
        try:
            raise CUDARuntimeError(719)
        except CUDARuntimeError as inner:
            raise RuntimeError("the task failed") from inner
    except RuntimeError as outer:
        assert "launch failure" in str(sticky_cuda_error(outer))
    assert sticky_cuda_error(CUDARuntimeError(2)) is None
    assert sticky_cuda_error(ValueError("700")) is None


class _FaultingClock(PhaseClock):
    def mark(self, phase: str) -> None:
        if phase == "kernel_ms":
            raise CUDARuntimeError(700)  # what a faulted kernel raises at the next sync
        super().mark(phase)


class FaultingCpu(CpuBackend):
    """A cpu backend whose every job ends as a CUDA illegal address would: test-only."""

    sticky_error_code = "cuda_sticky_error"

    def phase_clock(self) -> PhaseClock:
        return _FaultingClock(self.synchronize)

    def sticky_error(self, exc: BaseException) -> str | None:
        return sticky_cuda_error(exc)


def faulting_worker_main(spec: WorkerSpec, control: Connection, slot: Connection) -> None:
    backend = FaultingCpu(spec)
    Runner(backend, backend.warm(), control, [slot]).serve()


def cpu_spec() -> WorkerSpec:
    return WorkerSpec("cpu", 0, 2, 1, 0.5, 0, True, "auto", True)


def test_a_sticky_error_fails_the_job_with_its_code_then_the_worker_exits() -> None:
    """The job ends cuda_sticky_error with a clear message; the process exits with status 86."""
    spawn = multiprocessing.get_context("spawn")
    ours, theirs = spawn.Pipe()
    our_slot, their_slot = spawn.Pipe()
    args = (cpu_spec(), theirs, their_slot)
    process = spawn.Process(target=faulting_worker_main, args=args, daemon=True)
    process.start()
    theirs.close()
    their_slot.close()
    try:
        assert ours.poll(60), "the worker never reported warm"
        assert isinstance(msg.receive(ours), msg.Warm)
        msg.send(our_slot, msg.RunJob("j1", "noop", {}, {}, None))
        assert our_slot.poll(30), "the job never finished"
        finished = msg.receive(our_slot)
        process.join(30)
    finally:
        if process.is_alive():
            process.kill()
    assert isinstance(finished, msg.JobFinished)
    assert finished.error is not None
    code, message, hint = finished.error
    assert code == "cuda_sticky_error"
    assert "illegal memory access" in message and "worker restarts" in message
    assert hint
    assert process.exitcode == msg.EXIT_DEVICE_UNUSABLE


# ---------------------------------------------------------------------------- cache, devices


def test_kernel_caches_live_under_the_daemons_own_directories(tmp_path: Path) -> None:
    """Unset: under <state>/cache; systemd's CACHE_DIRECTORY wins; a set value is kept."""
    unset = kernel_cache_env(tmp_path, {})
    assert unset["CUPY_CACHE_DIR"] == str(tmp_path / "cache" / "cupy")
    assert unset["CUDA_CACHE_PATH"] == str(tmp_path / "cache" / "nv")
    systemd = kernel_cache_env(tmp_path, {"CACHE_DIRECTORY": "/var/cache/taogpud"})
    assert systemd["CUPY_CACHE_DIR"] == "/var/cache/taogpud/cupy"
    kept = kernel_cache_env(tmp_path, {"CUPY_CACHE_DIR": "/srv/k"})
    assert kept["CUPY_CACHE_DIR"] == "/srv/k"


def test_devices_shows_cards_processes_and_which_worker_holds_each() -> None:
    """Fed NVML data: index, UUID, capability, memory, utilisation, the worker by UUID, pids."""
    holder = nvml.GpuProcess(pid=4242, used_bytes=512 * 2**20, name="taogpud-worker")
    cards = inventory(card(0, free=60 * GIB, processes=(holder,)), card(1))
    workers = [{"device": "gpu:0", "uuid": cards.devices[0].uuid, "backend": "cuda"}]
    document = devices_document(cards, workers)
    assert header_lines(document) == ["NVIDIA driver 580.65.06, CUDA driver version 13.0, 2 GPU(s)"]
    first, second = gpu_rows(document)
    assert first == [
        0, cards.devices[0].uuid, "NVIDIA H100", "9.0", "80.0 GiB", "20.0 GiB", "60.0 GiB", "3%",
        "gpu:0",
    ]  # fmt: skip
    assert second[-1] is None
    assert process_lines(document) == ["gpu 0: pid 4242 (taogpud-worker) 512 MiB"]


def test_devices_without_a_driver_says_so() -> None:
    """No driver: one line with NVML's reason, no table."""
    document = devices_document(nvml.Inventory(reason="no NVIDIA driver on this host"), None)
    assert header_lines(document) == ["NVIDIA driver: none found (no NVIDIA driver on this host)"]
    assert gpu_rows(document) == [] and document["workers"] is None


def test_an_xid_reaches_every_job_open_on_the_device_when_it_is_read() -> None:
    """Fed XIDs (nvml.XidWatch.drain's answers): each goes to the jobs running when it was
    read, with the query that shows it in the kernel's log; none: an empty list."""
    at = time.time()
    feeds = iter([[], [], [nvml.Xid(UUID, 0, 79, at)], [], [nvml.Xid(UUID, 0, 48, at)]])
    sampler = UtilizationSampler(lambda: 50, period_s=10, read_xids=lambda: next(feeds))
    first = sampler.begin()  # read: none
    second = sampler.begin()  # read: none
    sampler.end(first)  # read: 79, for both
    third = sampler.begin()  # read: none
    sampler.end(second)  # read: 48, for second and third
    sampler.end(third)  # the feed is over: a failing read is no XID
    assert [x["xid"] for x in confirmed(first)["xid_errors"]] == [79]
    assert [x["xid"] for x in confirmed(second)["xid_errors"]] == [79, 48]
    assert [x["xid"] for x in confirmed(third)["xid_errors"]] == [48]
    assert confirmed(first)["xid_errors"][0]["uuid"] == UUID
    unwatched = UtilizationSampler(lambda: 50, period_s=10)
    job = unwatched.begin()
    unwatched.end(job)
    assert "xid_errors" not in confirmed(job)  # NVML reports no XIDs here: no section
