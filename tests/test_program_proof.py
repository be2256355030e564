"""The proof of a program's lease (programs/proof.py), from a fake NVML that reports per-process
use: no GPU runs here, so NVML's answers are the fake; the scheduler, its store and the
program's processes are real (the state machine's fake pool, its workers made CUDA ones)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from taogpud.backends.base import DeviceInfo, WorkerSpec
from taogpud.jobs.policy import Policy
from taogpud.jobs.programs import ProgramExit
from taogpud.jobs.records import JobRecord, JobState, Peer
from taogpud.observability import nvml
from taogpud.programs.proof import ProgramProof, children_now, process_tree
from taogpud.wire import ProgramRequest
from tests.test_scheduler_states import Incarnation

GIB = 2**30
UUIDS = ("GPU-00000000-0000-0000-0000-000000000000", "GPU-11111111-1111-1111-1111-111111111111")


def card(index: int, *procs: tuple[int, int], util: int = 50, energy: int = 0) -> nvml.GpuDevice:
    """A fake NVML device: `procs` are (pid, used bytes) as nvmlDeviceGetComputeRunningProcesses
    lists them."""
    return nvml.GpuDevice(
        index=index,
        name="Fake H200",
        uuid=UUIDS[index],
        pci_bus_id=f"0000:0{index}:00.0",
        compute_capability="9.0",
        memory_total_bytes=80 * GIB,
        memory_free_bytes=70 * GIB,
        memory_used_bytes=10 * GIB,
        utilization_percent=util,
        processes=tuple(nvml.GpuProcess(pid, used, "python3") for pid, used in procs),
        energy_mj=energy,
    )


def proof(timeout_s: float = 60.0) -> ProgramProof:
    return ProgramProof((UUIDS[0],), ("gpu:0",), (4 * GIB,), timeout_s, started_s=100.0)


def test_seen_on_its_gpu_the_proof_has_memory_utilisation_and_energy() -> None:
    watched = proof()
    assert watched.observe([card(0, (41, GIB), energy=5_000), card(1)], {41, 42}, 101.0) == []
    assert (
        watched.observe([card(0, (41, GIB), (42, GIB), util=93, energy=9_500)], {41, 42}, 102.0)
        == []
    )
    evidence = watched.evidence()
    assert evidence["pid_seen_on_gpu"] is True and evidence["seen_on"] == ["gpu:0"]
    assert evidence["peak_memory_bytes"] == 2 * GIB  # its two processes, summed
    assert evidence["utilization_peak_percent"] == 93 and evidence["utilization_samples"] == 2
    assert evidence["energy_j"] == 4.5 and evidence["first_seen_after_s"] == 1.0
    assert evidence["seen_on_unassigned"] == []


def test_over_its_reservation_it_is_stopped_naming_reservation_and_use() -> None:
    watched = proof()
    (verdict,) = watched.observe([card(0, (41, 3 * GIB), (43, 2 * GIB))], {41, 43}, 101.0)
    assert verdict.code == "gpu_memory_exceeded"
    assert "held 5,120 MiB of gpu:0, over its reservation of 4,096 MiB" in verdict.message
    assert watched.observe([card(0, (41, 6 * GIB))], {41}, 102.0) == []  # said once


def test_never_seen_on_its_gpu_by_the_first_use_timeout_is_the_cpu_fallback() -> None:
    watched = proof(timeout_s=30.0)
    other = (99, GIB)  # someone else's process on its GPU is not the program
    assert watched.observe([card(0, other)], {41}, 129.0) == []
    (verdict,) = watched.observe([card(0, other)], {41}, 130.0)
    assert verdict.code == "never_used_gpu"
    assert "has not opened any GPU it was given (gpu:0) in 30 s" in verdict.message
    assert "torch.cuda.is_available()" in verdict.hint


def test_seen_on_a_gpu_it_was_not_given_is_flagged() -> None:
    watched = proof()
    (verdict,) = watched.observe([card(0, (41, GIB)), card(1, (41, GIB))], {41}, 101.0)
    assert verdict.code == "unassigned_gpu" and UUIDS[1] in verdict.message
    assert watched.evidence()["seen_on_unassigned"] == [UUIDS[1]]


def test_the_process_tree_holds_the_program_and_its_descendants() -> None:
    with subprocess.Popen(["sh", "-c", "sleep 60 & wait"]) as shell:
        children: dict[int, list[int]] = {}
        while len(children.get(shell.pid, [])) < 1:
            children = children_now()
        tree = process_tree([shell.pid], children)
        assert shell.pid in tree and len(tree) == 2 and os.getpid() not in tree
        for pid in tree - {shell.pid}:
            os.kill(pid, signal.SIGKILL)
        shell.wait()


# --- through the scheduler: real processes, a fake NVML, the verdicts acted on -------------


@pytest.fixture
def cuda_scheduler(tmp_path: Path) -> Iterator[Incarnation]:
    """The state machine's incarnation with CUDA workers (uuids), under executor local."""
    incarnation = Incarnation(tmp_path / "jobs.sqlite3")
    incarnation.pool.executor = "local"
    for index, worker in enumerate(incarnation.pool.workers):
        worker.spec = WorkerSpec("cuda", index, 2, 1, 0.85, 0, True, "auto", False)
        worker.info = DeviceInfo(
            "cuda", f"gpu:{index}", index, "Fake H200", uuid=UUIDS[index],
            memory_total_bytes=80 * GIB, memory_cap_bytes=68 * GIB,
        )  # fmt: skip
    yield incarnation
    if not incarnation.loop.is_closed():  # a test's kill_9 closed it already
        incarnation.end()


def run_program(
    incarnation: Incarnation, policy: Policy
) -> tuple[JobRecord, subprocess.Popen[bytes]]:
    """A program granted gpu:0 with 4 GiB, started as a real child of this process."""
    scheduler = incarnation.scheduler
    incarnation.call(scheduler.apply_policy, policy)
    me = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    request = ProgramRequest(["sleep", "60"], "/", device=0, mem_bytes=4 * GIB)
    job = incarnation.call(scheduler.submit_program, request, me)
    assert job.status is JobState.running and job.program is not None
    assert job.program.env["CUDA_VISIBLE_DEVICES"] == UUIDS[0]
    assert job.program.env["CUPY_GPU_MEMORY_LIMIT"] == str(4 * GIB)
    process = subprocess.Popen(["sleep", "60"])
    incarnation.call(scheduler.programs.started, job.id, process.pid, me)
    return job, process


def end(incarnation: Incarnation, job: JobRecord, process: subprocess.Popen[bytes]) -> JobRecord:
    """What its starter does when told to stop, or at the end: SIGTERM, report."""
    process.send_signal(signal.SIGTERM)
    process.wait()
    me = Peer(pid=os.getpid(), uid=os.getuid(), gid=os.getgid())
    how = ProgramExit(None, "SIGTERM")
    return incarnation.call(incarnation.scheduler.programs.exited, job.id, me, how)


def test_memory_over_the_reservation_stops_the_program(cuda_scheduler: Incarnation) -> None:
    job, process = run_program(cuda_scheduler, Policy())
    seen = [card(0, (process.pid, 5 * GIB))]
    cuda_scheduler.call(cuda_scheduler.scheduler.programs.observe, seen, 1.0)
    assert job.program is not None and job.program.stop == "failed"  # its starter is told
    ended = end(cuda_scheduler, job, process)
    assert ended.status is JobState.failed and ended.error is not None
    assert ended.error.code == "gpu_memory_exceeded" and "4,096 MiB" in ended.error.message
    assert ended.evidence["peak_memory_bytes"] == 5 * GIB
    assert cuda_scheduler.scheduler.programs.verdicts["gpu_memory_exceeded"] == 1


@pytest.mark.parametrize("allow", [False, True], ids=["stopped", "flagged"])
def test_a_program_never_on_its_gpu_is_stopped_or_flagged(
    cuda_scheduler: Incarnation, allow: bool
) -> None:
    policy = Policy(allow_fallback_to_cpu=allow, first_use_timeout_s=0.001)
    job, process = run_program(cuda_scheduler, policy)
    cuda_scheduler.call(cuda_scheduler.scheduler.programs.observe, [card(0)], 1e12)
    assert job.program is not None
    if allow:
        assert job.program.stop is None and job.fallback is True
        assert job.fallback_reason and "has not opened any GPU" in job.fallback_reason
        ended = end(cuda_scheduler, job, process)
        assert ended.status is JobState.failed and ended.fallback is True  # killed by SIGTERM
    else:
        assert job.program.stop == "failed"
        ended = end(cuda_scheduler, job, process)
        assert ended.error is not None and ended.error.code == "never_used_gpu"
    assert ended.evidence["pid_seen_on_gpu"] is False and ended.evidence["nvml_samples"] == 1


def test_a_reused_pid_is_not_adopted_after_a_restart(
    cuda_scheduler: Incarnation, tmp_path: Path
) -> None:
    """A restart finds a granted lease whose program pid now names another process (same
    pid, another start time) and whose starter is gone: not adopted, the job ends
    interrupted, its devices free; the process that has the pid now is left alone."""
    job, process = run_program(cuda_scheduler, Policy())
    store = cuda_scheduler.store
    assert job.program is not None and job.program.pid_start is not None
    job.program.pid_start -= 1  # as if the pid had been given to this process after the program
    job.program.client_pid, job.program.client_start = process.pid, 1  # and its starter gone
    store.save(job)
    cuda_scheduler.call(store.flush)
    cuda_scheduler.kill_9()
    again = Incarnation(tmp_path / "jobs.sqlite3")
    again.pool.executor = "local"
    try:
        again.call(again.scheduler.recover, again.store.unfinished())
        ended = again.scheduler.get(job.id)
        assert ended.status is JobState.interrupted and ended.error is not None
        assert "neither the program nor its starter runs" in ended.error.message
        assert again.scheduler.running_total == 0 and process.poll() is None
    finally:
        again.end()
        process.kill()
        process.wait()


# --- XID errors: NVML's XidCriticalError events, from a fake NVML that delivers them --------


class FakeNvmlError(Exception):
    pass


class FakeTimeout(FakeNvmlError):
    pass


class FakeNotSupported(FakeNvmlError):
    pass


class FakeNvml(types.ModuleType):
    """pynvml's event API as the driver answers it: devices that support XID events, events
    queued until nvmlEventSetWait_v2 hands them out, NVML_ERROR_TIMEOUT once none is left."""

    NVMLError = FakeNvmlError
    NVMLError_Timeout = FakeTimeout
    NVMLError_NotSupported = FakeNotSupported
    nvmlEventTypeXidCriticalError = 0x8
    nvmlEventTypeSingleBitEccError = 0x1

    def __init__(self, supports: tuple[bool, ...] = (True, True)) -> None:
        super().__init__("pynvml")
        self.supports = supports
        self.registered: list[int] = []
        self.queue: list[types.SimpleNamespace] = []
        self.inits = 0

    def deliver(self, index: int, xid: int, kind: int = 0x8) -> None:
        self.queue.append(types.SimpleNamespace(device=index, eventType=kind, eventData=xid))

    def nvmlInit(self) -> None:
        self.inits += 1

    def nvmlShutdown(self) -> None:
        self.inits -= 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.supports)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetIndex(self, handle: int) -> int:
        return handle

    def nvmlDeviceGetUUID(self, handle: int) -> str:
        return UUIDS[handle]

    def nvmlDeviceGetSupportedEventTypes(self, handle: int) -> int:
        return 0x8 | 0x1 if self.supports[handle] else 0x1

    def nvmlEventSetCreate(self) -> str:
        return "event set"

    def nvmlDeviceRegisterEvents(self, handle: int, kinds: int, event_set: str) -> None:
        if not self.supports[handle] or kinds != 0x8:
            raise FakeNotSupported("Not Supported")
        self.registered.append(handle)

    def nvmlEventSetWait_v2(self, event_set: str, timeout_ms: int) -> types.SimpleNamespace:
        assert event_set == "event set" and timeout_ms == 0  # a sample never waits on it
        if not self.queue:
            raise FakeTimeout("Timeout")
        return self.queue.pop(0)

    def nvmlEventSetFree(self, event_set: str) -> None:
        self.registered.clear()


@pytest.fixture
def fake_nvml(monkeypatch: pytest.MonkeyPatch) -> FakeNvml:
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def test_xids_are_read_from_every_device_that_reports_them(monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeNvml(supports=(True, False))
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    watch = nvml.XidWatch.open()
    assert watch is not None and fake.registered == [0]
    assert watch.drain() == []
    fake.deliver(0, 79)
    fake.deliver(0, 0, kind=0x1)  # another kind of event: not an XID
    fake.deliver(0, 48)
    found = watch.drain()
    assert [(x.uuid, x.index, x.code) for x in found] == [(UUIDS[0], 0, 79), (UUIDS[0], 0, 48)]
    assert watch.drain() == []  # each read once
    watch.close()
    assert fake.inits == 0 and fake.registered == []


def test_without_nvml_there_is_no_xid_watch_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    assert nvml.XidWatch.open() is None  # nvidia-ml-py here, no driver: nvmlInit fails
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` fails, as if absent
    assert nvml.XidWatch.open() is None
    monkeypatch.setitem(sys.modules, "pynvml", FakeNvml(supports=(False, False)))
    assert nvml.XidWatch.open() is None  # no device reports XIDs


def test_an_xid_on_its_gpu_is_in_its_evidence_not_another_gpus(fake_nvml: FakeNvml) -> None:
    watch = nvml.XidWatch.open()
    assert watch is not None
    watched = proof()
    assert watched.record_xids(watch.drain(), 101.0) == []
    assert watched.evidence()["xid_errors"] == []  # watched, none seen
    fake_nvml.deliver(0, 79)
    fake_nvml.deliver(1, 13)  # on a GPU it was not given
    (new,) = watched.record_xids(watch.drain(), 102.0)
    (xid,) = watched.evidence()["xid_errors"]
    assert new == xid
    assert xid["xid"] == 79 and xid["gpu"] == "gpu:0" and xid["uuid"] == UUIDS[0]
    assert xid["seen_after_s"] == 2.0 and isinstance(xid["at"], str)  # ISO time, UTC


def test_without_an_xid_watch_the_evidence_has_no_xid_section() -> None:
    watched = proof()
    watched.observe([card(0)], {41}, 101.0)
    assert "xid_errors" not in watched.evidence()


def test_an_xid_during_a_lease_is_in_its_record_and_trace(
    cuda_scheduler: Incarnation, fake_nvml: FakeNvml
) -> None:
    watch = nvml.XidWatch.open()
    assert watch is not None
    job, process = run_program(cuda_scheduler, Policy())
    fake_nvml.deliver(0, 79)
    observe = cuda_scheduler.scheduler.programs.observe
    with capture_logs() as lines:
        cuda_scheduler.call(observe, [card(0, (process.pid, GIB))], 1.0, watch.drain())
    (warned,) = [line for line in lines if line["event"] == "program.xid"]
    assert warned["xid"] == 79 and warned["gpu"] == "gpu:0" and warned["job_id"] == job.id
    ended = end(cuda_scheduler, job, process)
    assert [x["xid"] for x in ended.evidence["xid_errors"]] == [79]
    assert cuda_scheduler.store.get(job.id).evidence["xid_errors"][0]["xid"] == 79


def test_the_utilisation_window_is_in_the_evidence() -> None:
    watched = proof()
    for now in (101.0, 102.0, 104.5):
        watched.observe([card(0, (41, GIB))], {41}, now)
    evidence = watched.evidence()
    assert evidence["utilization_samples"] == 3
    assert evidence["utilization_first_after_s"] == 1.0
    assert evidence["utilization_last_after_s"] == 4.5
    assert evidence["utilization_interval_s"] == 1.75  # the mean between its samples


def test_an_xid_watch_for_one_gpu_registers_that_gpu_alone(fake_nvml: FakeNvml) -> None:
    """A CUDA worker's watch: its own device only, by UUID."""
    watch = nvml.XidWatch.open(uuids=(UUIDS[1],))
    assert watch is not None and fake_nvml.registered == [1]
    assert nvml.XidWatch.open(uuids=("GPU-elsewhere",)) is None
