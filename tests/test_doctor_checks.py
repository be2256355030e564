"""The doctor's checks as pure functions, fed NVML data, job records and config; plus the real
NVML and CuPy readers on this host (no GPU: their reasons; a GPU: marked `gpu`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taogpud import config
from taogpud.doctor import (
    ORDER,
    Check,
    Target,
    check_api_key,
    check_config_files,
    check_config_pair,
    check_probe,
    check_recent_backends,
    check_shell_env,
    guarded,
    in_order,
    report_ok,
)
from taogpud.doctor.gpu import (
    CudaRuntime,
    HostFacts,
    check_cuda_arch,
    check_cuda_driver,
    check_gpu_memory,
    check_wsl,
    cuda_runtime,
    gather_host,
    host_checks,
)
from taogpud.jobs.records import JobErrorView, JobRecord, JobState
from taogpud.observability import nvml
from taogpud.testing import write_pair

GIB = 1024**3
CUDA = Target(
    backend="cuda", allow_fallback=False, device_ids=[0], cuda_arch="sm_89", memory_fraction=0.85
)
CUDA_FALLBACK = Target(
    backend="cuda", allow_fallback=True, device_ids=[0], cuda_arch="sm_89", memory_fraction=0.85
)
CPU = Target(
    backend="cpu", allow_fallback=False, device_ids=[0], cuda_arch="sm_89", memory_fraction=0.85
)
UUID_0 = "GPU-11111111-2222-3333-4444-555555555555"
UUID_1 = "GPU-99999999-2222-3333-4444-555555555555"
NO_DRIVER = nvml.Inventory(reason="no NVIDIA driver on this host (libnvidia-ml.so.1 not found)")
RUNTIME_12 = CudaRuntime("12.9", "cupy-cuda12x 14.2.0")
WSL2 = (
    "Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc (GCC) 11.2.0, "
    "GNU ld (GNU Binutils) 2.37) #1 SMP Tue Nov 5 00:21:55 UTC 2024"
)
WSL1 = (
    "Linux version 4.4.0-19041-Microsoft (Microsoft@Microsoft.com) (gcc version 5.4.0 (GCC) ) "
    "#1237-Microsoft Sat Sep 11 14:32:00 PST 2021"
)
NATIVE = "Linux version 6.1.0-27-amd64 (debian-kernel@lists.debian.org) (gcc-12 (Debian 12.2.0-14))"


def card(
    index: int = 0,
    cc: str = "8.9",
    uuid: str = UUID_0,
    total_gib: float = 24,
    free_gib: float = 23,
    processes: tuple[nvml.GpuProcess, ...] = (),
    name: str = "NVIDIA GeForce RTX 4090",
) -> nvml.GpuDevice:
    total, free = int(total_gib * GIB), int(free_gib * GIB)
    return nvml.GpuDevice(
        index=index,
        name=name,
        uuid=uuid,
        pci_bus_id=f"00000000:0{index + 1}:00.0",
        compute_capability=cc,
        memory_total_bytes=total,
        memory_free_bytes=free,
        memory_used_bytes=total - free,
        processes=processes,
    )


def inventory(*cards: nvml.GpuDevice, cuda: str = "12.9") -> nvml.Inventory:
    return nvml.Inventory(devices=cards, driver_version="575.57.08", cuda_driver_version=cuda)


def job(**fields: Any) -> JobRecord:
    record: dict[str, Any] = {
        "id": "0001",
        "task": "probe",
        "params": {},
        "status": JobState.succeeded,
        "backend": "cuda",
        "device": "gpu:0",
        "device_uuid": UUID_0,
        "worker_pid": 4242,
        "result": {"device": "gpu:0", "backend": "cuda"},
    }
    record.update(fields)
    return JobRecord(**record)


# --- the framework -------------------------------------------------------------------------


def test_a_crashing_check_fails_alone() -> None:
    """guarded(): a check that raises becomes a fail of that check, naming the exception."""

    def broken() -> Check:
        raise KeyError("boom")

    result = guarded("cuda_arch", broken)
    assert result.status == "fail" and "KeyError" in result.detail and result.hint


def test_order_and_ok() -> None:
    """Checks come out in the documented order; ok is false only when one failed."""
    checks = [Check("wsl", "pass", ""), Check("daemon", "warn", ""), Check("api_key", "skip", "")]
    assert [c.name for c in in_order(checks)] == ["daemon", "api_key", "wsl"]
    assert report_ok(checks)
    assert not report_ok([*checks, Check("probe_job", "fail", "")])
    assert len(set(ORDER)) == len(ORDER) == 14


# --- probe_job -----------------------------------------------------------------------------


def test_probe_on_cuda_with_nvml_evidence_passes() -> None:
    """A probe on gpu:0 backend=cuda, and NVML lists the worker's pid on that UUID → pass."""
    seen = inventory(card(processes=(nvml.GpuProcess(4242, 600 << 20, "python"),)))
    result = check_probe(CUDA, [job()], seen)
    assert result.status == "pass"
    assert "device=gpu:0 backend=cuda" in result.detail
    assert "NVML sees worker pid 4242" in result.detail and UUID_0 in result.detail


def test_probe_on_cuda_without_the_pid_in_nvml_warns() -> None:
    """The right backend, but NVML does not list the worker → warn (container pid namespaces)."""
    result = check_probe(CUDA, [job()], inventory(card()))
    assert result.status == "warn" and "does not list worker pid 4242" in result.detail


def test_probe_that_fell_back_fails_loudly() -> None:
    """cuda configured, the probe ran with fallback=true → fail, the reason said once."""
    fell_back = job(
        backend="cpu",
        device="cpu:0",
        device_uuid=None,
        fallback=True,
        fallback_reason="No NVIDIA driver is loaded",
        result={"device": "cpu:0"},
    )
    other = fell_back.model_copy(
        update={"id": "0002", "device": "cpu:1", "result": {"device": "cpu:1"}}
    )
    result = check_probe(CUDA_FALLBACK, [fell_back, other], NO_DRIVER)
    assert result.status == "fail"
    assert "device=cpu:0 backend=cpu fallback=true" in result.detail
    assert result.detail.count("No NVIDIA driver is loaded") == 1
    assert "allowFallbackToCpu" in result.hint


def test_probe_on_a_cpu_config_passes_with_backend_cpu() -> None:
    """gpu.backend=cpu and the probe says backend=cpu → pass."""
    on_cpu = job(backend="cpu", device="cpu:0", device_uuid=None, result={"device": "cpu:0"})
    result = check_probe(CPU, [on_cpu], NO_DRIVER)
    assert result.status == "pass" and result.detail == "device=cpu:0 backend=cpu"


@pytest.mark.parametrize(
    ("fields", "status", "words"),
    [
        (
            {"status": JobState.failed, "error": JobErrorView(code="task_failed", message="bad")},
            "fail",
            "bad",
        ),
        ({"status": JobState.queued, "backend": None, "device": None}, "warn", "still queued"),
        ({"result": {"device": "gpu:1"}}, "fail", "worker says it ran on gpu:1"),
        (
            {"backend": "cpu", "device": "cpu:0", "result": {"device": "cpu:0"}},
            "fail",
            "cuda is configured",
        ),
    ],
)
def test_probe_failures(fields: dict[str, Any], status: str, words: str) -> None:
    """Failed, still queued, worker disagreeing, cpu on cuda config: each said at its level."""
    result = check_probe(CUDA, [job(**fields)], inventory(card()))
    assert result.status == status and words in result.detail


def test_probe_of_a_dead_worker_fails() -> None:
    """A worker the runner could not probe is reported with the level it gave."""
    result = check_probe(CUDA, [], NO_DRIVER, [("fail", "gpu:1: the worker is dead (restarts 3)")])
    assert result.status == "fail" and "dead" in result.detail
    assert check_probe(CUDA, [], NO_DRIVER).status == "fail"


# --- recent_backends ---------------------------------------------------------------------------


def test_cpu_jobs_without_fallback_allowed_fail() -> None:
    """cuda, allowFallbackToCpu=false, and a recent job on the CPU → fail with the spread."""
    jobs = [job(), job(id="2"), job(id="3", backend="cpu", device="cpu:0")]
    result = check_recent_backends(CUDA, jobs)
    assert result.status == "fail"
    assert "cuda 2, cpu 1" in result.detail and "allowFallbackToCpu=false" in result.detail
    assert "BACKEND=cpu" in result.hint


def test_cpu_fallback_jobs_allowed_warn_and_cpu_configs_pass() -> None:
    """Allowed fallback jobs warn; cpu configs pass; no finished jobs skips."""
    fell = job(backend="cpu", device="cpu:0", fallback=True)
    assert check_recent_backends(CUDA_FALLBACK, [fell]).status == "warn"
    assert "cpu (fallback) 1" in check_recent_backends(CUDA_FALLBACK, [fell]).detail
    assert check_recent_backends(CPU, [job(backend="cpu", device="cpu:0")]).status == "pass"
    queued = job(status=JobState.queued, backend=None)
    assert check_recent_backends(CUDA, [queued]).status == "skip"


# --- cuda_driver ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "seen", "runtime", "status", "words"),
    [
        (CPU, NO_DRIVER, RUNTIME_12, "skip", "so none is needed"),
        (CUDA, NO_DRIVER, RUNTIME_12, "fail", "gpu.backend is cuda but no NVIDIA driver"),
        (CUDA, inventory(card(), cuda="12.9"), RUNTIME_12, "pass", "built for CUDA 12.9"),
        (
            CUDA,
            inventory(card(), cuda="12.4"),
            RUNTIME_12,
            "warn",
            "a little newer than the driver",
        ),
        (CUDA, inventory(card(), cuda="11.8"), RUNTIME_12, "fail", "too old"),
        (CPU, inventory(card(), cuda="11.8"), RUNTIME_12, "warn", "too old"),
        (
            CUDA,
            inventory(card(), cuda="13.0"),
            CudaRuntime("13.0", "cupy-cuda13x"),
            "pass",
            "recommends 12.x",
        ),
        (CUDA, inventory(card(), cuda="12.2"), CudaRuntime("11.8", "cupy-cuda11x"), "warn", "11.8"),
        (
            CUDA,
            inventory(card()),
            CudaRuntime(None, None, "CuPy is not installed"),
            "fail",
            "CuPy is not installed",
        ),
        (
            CPU,
            inventory(card()),
            CudaRuntime(None, None, "CuPy is not installed"),
            "skip",
            "not installed",
        ),
    ],
)
def test_cuda_driver_against_the_cupy_runtime(
    target: Target, seen: nvml.Inventory, runtime: CudaRuntime, status: str, words: str
) -> None:
    """Driver CUDA vs CuPy's: ≥ pass, minor behind warn, major behind fail on cuda."""
    result = check_cuda_driver(target, seen, runtime)
    assert result.status == status, result
    assert words in result.detail + result.hint


# --- cuda_arch ----------------------------------------------------------------------------------


def test_cuda_arch_matching_the_card_passes() -> None:
    """sm_89 on a compute capability 8.9 card → pass."""
    result = check_cuda_arch(CUDA, inventory(card(cc="8.9")))
    assert result.status == "pass" and "gpu:0 NVIDIA GeForce RTX 4090 is sm_89" in result.detail


def test_cuda_arch_mismatch_says_the_value_to_use() -> None:
    """sm_89 on a 9.0 card (H100/H200) → fail; the fix is sm_90."""
    result = check_cuda_arch(CUDA, inventory(card(cc="9.0", name="NVIDIA H200")))
    assert result.status == "fail"
    assert "compute capability 9.0" in result.detail
    assert 'cuda_arch = "sm_90"' in result.hint


def test_cuda_arch_with_the_cards_own_feature_set_passes() -> None:
    """sm_90a (9.0's arch-specific features) on a 9.0 card → pass, as the worker accepts it."""
    target = Target("cuda", False, [0], "sm_90a", 0.85)
    result = check_cuda_arch(target, inventory(card(cc="9.0", name="NVIDIA H200")))
    assert result.status == "pass", result


def test_cuda_arch_on_mixed_cards_suggests_auto_and_auto_passes() -> None:
    """Two cards of different capability → the fix is "auto"; "auto" itself passes."""
    both = inventory(card(0, "8.0", UUID_0), card(1, "9.0", UUID_1))
    target = Target("cuda", False, [0, 1], "sm_80", 0.85)
    result = check_cuda_arch(target, both)
    assert result.status == "fail" and '"auto"' in result.hint
    auto = Target("cuda", False, "all", "auto", 0.85)
    assert check_cuda_arch(auto, both).status == "pass"


def test_cuda_arch_follows_cuda_visible_devices_and_missing_ids_fail() -> None:
    """CUDA_VISIBLE_DEVICES reorders cards; a missing id fails; no GPU or cpu skips."""
    both = inventory(card(0, "8.0", UUID_0), card(1, "8.9", UUID_1))
    visible = Target("cuda", False, [0], "sm_89", 0.85, cuda_visible_devices="1")
    assert check_cuda_arch(visible, both).status == "pass"
    by_uuid = Target("cuda", False, [0], "sm_89", 0.85, cuda_visible_devices="GPU-9999")
    assert check_cuda_arch(by_uuid, both).status == "pass"
    missing = Target("cuda", False, [0, 3], "sm_89", 0.85)
    result = check_cuda_arch(missing, inventory(card()))
    assert result.status == "fail" and "lists 3" in result.detail
    assert check_cuda_arch(CUDA, NO_DRIVER).status == "skip"
    assert check_cuda_arch(CPU, inventory(card())).status == "skip"


# --- gpu_memory --------------------------------------------------------------------------------


def test_memory_cap_above_what_is_free_warns_and_names_the_holders() -> None:
    """Cap above free memory → warn naming the holders (pid, name, GiB) and a fitting fraction."""
    holder = nvml.GpuProcess(777, 13 * GIB, "blender")
    result = check_gpu_memory(CUDA, inventory(card(free_gib=10, processes=(holder,))), set())
    assert result.status == "warn"
    assert "20.4 GiB" in result.detail and "10.0 GiB free now" in result.detail
    assert "pid 777 (blender) 13.0 GiB" in result.detail
    assert "fraction ≤ 0.42 fits" in result.detail
    assert "memoryFraction" in result.hint


def test_memory_held_by_our_own_workers_counts_as_ours() -> None:
    """Memory the daemon's workers hold is usable by taogpud: with it the cap fits → pass."""
    ours = nvml.GpuProcess(4242, 12 * GIB, "python")
    result = check_gpu_memory(CUDA, inventory(card(free_gib=10, processes=(ours,))), {4242})
    assert result.status == "pass" and "held by taogpud's workers" in result.detail
    assert check_gpu_memory(CPU, inventory(card()), set()).status == "skip"
    assert check_gpu_memory(CUDA, NO_DRIVER, set()).status == "skip"


# --- wsl ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "target", "status", "words"),
    [
        (WSL2, CUDA, "pass", "about 4 % below native Linux is normal"),
        (WSL1, CUDA, "fail", "WSL1"),
        (WSL1, CPU, "warn", "WSL1"),
        (NATIVE, CUDA, "pass", "not WSL"),
        ("", CUDA, "pass", "not WSL"),
    ],
)
def test_wsl_from_proc_version(text: str, target: Target, status: str, words: str) -> None:
    """/proc/version: WSL2 passes (4 % loss normal), WSL1 has no GPU, else not WSL."""
    result = check_wsl(text, target)
    assert result.status == status and words in result.detail


# --- the key ------------------------------------------------------------------------------------


def test_api_key_by_source() -> None:
    """credential and env pass, a literal apiKey warns, none fails listing what was tried."""
    assert check_api_key("credential", "TAOTOKEN_API_KEY").status == "pass"
    assert check_api_key("env", "TAOTOKEN_API_KEY").status == "pass"
    assert check_api_key("file", "TAOTOKEN_API_KEY").status == "warn"
    none = check_api_key("none", "TAOTOKEN_API_KEY", ("the credential X", "the env var Y"))
    assert none.status == "fail" and "the credential X; the env var Y" in none.detail


@pytest.mark.parametrize(
    ("shell", "daemon", "status", "words"),
    [
        (True, "credential", "pass", "nothing uses it there"),
        (False, "env", "pass", "need not"),
        (True, "none", "fail", "does not inherit your shell's environment"),
        (False, "none", "pass", "does not need it"),
        (True, None, "skip", "cannot be checked"),
    ],
)
def test_shell_env_is_never_needed(
    shell: bool, daemon: str | None, status: str, words: str
) -> None:
    """The shell never needs the key; only shell-has-it, service-does-not fails."""
    result = check_shell_env(shell, "TAOTOKEN_API_KEY", daemon)
    assert result.status == status and words in result.detail


# --- config ---------------------------------------------------------------------------------------


def load_pair(tmp_path: Path, settings: dict[str, Any], toml: str) -> config.ConfigSnapshot:
    return config.load(*write_pair(tmp_path, settings, toml), environ={})


CPU_TOML = '[runtime]\ndevice_type = "cpu"\n[backend.cuda]\nenabled = false\n'


def test_config_pair_uses_the_configs_own_rules(tmp_path: Path) -> None:
    """Agreeing files pass; timeouts that differ warn (config_rules.check_pair)."""
    agreeing = load_pair(tmp_path, {"gpu": {"backend": "cpu"}}, CPU_TOML)
    assert check_config_pair(agreeing.settings, agreeing.config).status == "pass"
    slow = load_pair(
        tmp_path, {"gpu": {"backend": "cpu"}, "provider": {"timeoutMs": 5000}}, CPU_TOML
    )
    result = check_config_pair(slow.settings, slow.config)
    assert result.status == "warn" and "provider.timeoutMs" in result.detail


def test_config_files_against_the_running_pair(tmp_path: Path) -> None:
    """Files differing from the running pair warn; errors fail; unreadable files skip."""
    running = load_pair(tmp_path, {"gpu": {"backend": "cpu"}}, CPU_TOML).redacted()
    edited = load_pair(tmp_path, {"gpu": {"backend": "cpu", "memoryFraction": 0.5}}, CPU_TOML)
    result = check_config_files("files", list(edited.warnings), running, edited.redacted())
    assert result.status == "warn" and "settings.gpu.memoryFraction" in result.detail
    assert "reload" in result.hint
    same = check_config_files("files", [], running, running)
    assert same.status == "pass" and "match what the daemon runs" in same.detail
    try:
        load_pair(tmp_path, {"gpu": {"backend": "cpu", "deviceId": "x"}}, CPU_TOML)
    except config.ConfigError as exc:
        problems = exc.problems
    failed = check_config_files("files", problems, running, None)
    assert failed.status == "fail" and "gpu.deviceId" in failed.detail
    assert check_config_files("files", [], None, None, unreadable="/etc/x").status == "skip"


# --- the real readers on this host -------------------------------------------------------------

HERE = nvml.inventory()


@pytest.mark.skipif(HERE.available, reason="this host has an NVIDIA driver")
def test_nvml_without_a_driver_is_empty_and_says_why() -> None:
    """No driver: inventory() returns no devices and one sentence of reason, never raises."""
    assert HERE.devices == () and HERE.reason
    assert "driver" in HERE.reason or "nvidia-ml-py" in HERE.reason


def test_host_checks_on_this_host_never_raise() -> None:
    """The real NVML, CuPy and /proc/version on this host: four checks, each a verdict."""
    facts = gather_host()
    for target in (CUDA, CPU):
        checks = host_checks(target, facts)
        assert [c.name for c in checks] == ["cuda_driver", "cuda_arch", "gpu_memory", "wsl"]
        assert all("the check itself failed" not in c.detail for c in checks)
    if not facts.inventory.available:
        assert [c.status for c in host_checks(CPU, facts)][:3] == ["skip", "skip", "skip"]
        assert host_checks(CUDA, facts)[0].status == "fail"


def test_cupy_runtime_version_reads_without_a_gpu() -> None:
    """CuPy says which CUDA it is built for with or without a driver (or why it cannot)."""
    runtime = cuda_runtime()
    assert (runtime.version is None) == (runtime.reason is not None)
    if runtime.version is not None:
        assert runtime.version.split(".")[0] in {"11", "12", "13"}


@pytest.mark.gpu
@pytest.mark.skipif(not HERE.devices, reason=f"needs an NVIDIA GPU: {HERE.reason}")
def test_nvml_on_a_gpu_host_lists_cards_and_the_doctor_agrees() -> None:
    """GPU host: cards have UUID, capability, memory; cuda_arch auto passes, driver no fail."""
    for gpu in HERE.devices:
        assert gpu.uuid and gpu.compute_capability and gpu.memory_total_bytes > 0
    facts = HostFacts(HERE, cuda_runtime(), "")
    target = Target("cuda", False, "all", "auto", 0.85)
    checks = {c.name: c for c in host_checks(target, facts)}
    assert checks["cuda_arch"].status == "pass"
    assert checks["cuda_driver"].status != "fail", checks["cuda_driver"]
