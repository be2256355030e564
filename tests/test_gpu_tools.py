"""The GPU check's tools without a GPU: the carried wheels derived from the closure minus
the host list (scripts/gpu_wheels.py), and the check's /dev/shm sizing and bounded
subprocesses (scripts/gpu_check.py)."""

from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path
from types import ModuleType

import pytest

SCRIPTS = Path(__file__).resolve().parent.parent / "scripts"


def load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, SCRIPTS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def wheels() -> ModuleType:
    return load("gpu_wheels")


def test_the_carried_wheels_are_the_closure_minus_what_the_host_has(wheels: ModuleType) -> None:
    """fastapi's opentelemetry-api travels; typer (version unknown there) travels; numpy,
    httpx and the rest of the host's list do not."""
    carried = wheels.carried_from_installed(wheels.read_host_list())
    assert {"opentelemetry-api", "fastapi", "pydantic", "uvicorn", "typer"} <= set(carried)
    assert not {"numpy", "httpx", "rich", "click", "prometheus-client"} & set(carried)


def test_a_host_version_the_closure_cannot_use_is_carried(
    wheels: ModuleType, tmp_path: Path
) -> None:
    """A host structlog older than pyproject's bound is carried (and shadows it there)."""
    host = tmp_path / "packages.txt"
    host.write_text("structlog==20.1.0  # assumed\nanyio==4.16.0  # assumed\n")
    carried = wheels.carried_from_installed(wheels.read_host_list(host))
    assert "structlog" in carried
    assert "anyio" not in carried


def test_the_host_list_reads_tags_and_names_canonically(wheels: ModuleType) -> None:
    host = wheels.read_host_list()
    assert host["typing-extensions"].trusted
    assert not host["typer"].trusted  # "# unknown"
    assert host["cupy-cuda13x"].version == "14.2.0"


@pytest.fixture(scope="module")
def check() -> ModuleType:
    return load("gpu_check")


def test_the_bandwidth_inputs_fit_half_of_dev_shm(check: ModuleType) -> None:
    """600 MB of /dev/shm: a and b both fit in the daemon's half (the second upload used to
    evict the first); a large one keeps 1e8 elements."""
    n = check.fitting_elements((600 * 10**6, 600 * 10**6))
    assert 2 * 4 * n <= 300 * 10**6
    assert check.fitting_elements((24 * 2**30, 24 * 2**30)) == check.BIG_N


def test_the_shm_h2d_client_memory_fits_the_daemons_quota(check: ModuleType) -> None:
    """The shm_h2d check's client memory (16 bytes an element, plus 1 MiB) stays inside the
    per-uid quota, half of /dev/shm: 600 MB gives less than 300 MB; a large one 64 Mi."""
    n = check.shm_elements((600 * 10**6, 600 * 10**6))
    assert 16 * n + (1 << 20) <= 300 * 10**6
    assert check.shm_elements((64 * 2**30, 64 * 2**30)) == 64 << 20


def test_every_cap_is_a_share_of_the_deadline_and_never_past_it(check: ModuleType) -> None:
    clock = check.Clock(deadline_s=100)
    assert clock.cap_s("warm_up") == pytest.approx(35)
    clock.started -= 80  # 80 s gone: 20 left, 10 of them kept for the report
    assert clock.cap_s("warm_up") == pytest.approx(10, abs=0.1)


def test_a_subprocess_past_its_timeout_is_killed_with_its_output_kept(
    check: ModuleType,
) -> None:
    started = time.monotonic()
    command = [sys.executable, "-c", "print('started', flush=True); import time; time.sleep(60)"]
    result = check.bounded(command, 1.0)
    assert time.monotonic() - started < 10
    assert result.returncode == 124
    assert "started" in result.output and "killed after" in result.output
