"""`taogpuctl top`: the frame on fed data (GPU fields need a GPU: NVML's answer is fed), and
one real frame from a daemon with a job in a slot and one queued."""

from __future__ import annotations

import io
from typing import Any

from rich.console import Console

from taogpud.cli.top import Snapshot, elapsed, frame
from taogpud.observability import nvml
from taogpud.testing import Ctl

GPU_STATUS: dict[str, Any] = {
    "state": "ready",
    "backend": "cuda",
    "fallback": False,
    "running": 1,
    "queued": 1,
    "max_concurrent_tasks": 8,
    "queue_limit": 1000,
    "workers": [{"device": "gpu:0", "index": 0, "pid": 4242, "state": "warm", "slots": 2}],
}


def rendered(snapshot: Snapshot) -> str:
    console = Console(width=160, record=True, file=io.StringIO())
    console.print(frame(snapshot))
    return console.export_text()


def test_gpu_frame_shows_nvml_fields_slots_and_queue() -> None:
    """A GPU worker's row has NVML's utilisation, memory, temperature and power; slot 1 holds
    the running job (user, task, elapsed), slot 2 is idle; the queued job is below."""
    gpu = nvml.GpuDevice(
        index=0,
        name="NVIDIA H200",
        uuid="GPU-1",
        pci_bus_id="0000:17:00.0",
        compute_capability="9.0",
        memory_total_bytes=141 * 1024**3,
        memory_free_bytes=131 * 1024**3,
        memory_used_bytes=10 * 1024**3,
        utilization_percent=87,
        temperature_c=54,
        power_w=412.3,
    )
    now = 1000.0
    running = [{"id": "j1", "device": "gpu:0", "task": "matmul", "peer": {"uid": 0}}]
    running[0]["started_at"] = now - 75
    queued = [{"id": "j2", "task": "fft", "peer": {"uid": 0}, "created_at": now - 3}]
    text = rendered(Snapshot(GPU_STATUS, running, queued, {0: gpu}, None, now))
    row = next(line for line in text.splitlines() if "gpu:0" in line)
    for cell in ("NVIDIA H200", "87%", "10.0 GiB / 141.0 GiB", "54°C", "412 W", "4242", "warm"):
        assert cell in row, row
    assert "1/2" in row and "j1" in row and "root" in row and "matmul" in row and "1m15s" in row
    assert any("2/2" in line and "idle" in line for line in text.splitlines())
    assert "queue: 1 job" in text
    assert any("j2" in line and "fft" in line and "3.0s" in line for line in text.splitlines())


def test_elapsed_reads_like_a_clock() -> None:
    """0.4 s, 12 s, 3 min 5 s and 1 h 2 min, as top shows them."""
    assert [elapsed(s) for s in (0.4, 12, 185, 3720)] == ["0.4s", "12s", "3m05s", "1h02m"]


def test_top_once_on_the_cpu_daemon(inprocess_daemon: Any) -> None:
    """`top --once` against the CPU daemon: its workers, a running sleep in a slot (its id in
    the short form), no NVML columns, and the header saying why there are no NVML fields when
    there is no driver."""
    ctl: Ctl = inprocess_daemon.ctl
    job_id = ctl("submit", "sleep", "--param", "ms=20000").stdout.strip()
    inprocess_daemon.wait_running(job_id)
    result = ctl("top", "--once")
    assert result.returncode == 0, result.stderr
    assert "cpu:0" in result.stdout and "cpu:1" in result.stdout
    assert any(job_id[:6] + " " in line and "sleep" in line for line in result.stdout.splitlines())
    assert "util" not in result.stdout
    if not nvml.inventory().available:
        assert "NVML: " in result.stdout
    assert ctl("cancel", job_id).returncode == 0
