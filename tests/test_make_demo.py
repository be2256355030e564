"""`make demo` installs what the host runs (issue 23.5): its own venv, and on a host without an
NVIDIA driver taogpud alone: no CuPy (NVRTC), Ray or pyopencl. Read from make's dry run (-n),
which prints the commands without running them."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
HEAVY_EXTRAS = ("cuda12", "cuda13", "ray", "opencl", "dev", "bench")


def demo_commands(tmp_path: Path, *overrides: str) -> list[str]:
    if shutil.which("make") is None:
        pytest.skip("needs make")
    done = subprocess.run(
        ["make", "-n", "--no-print-directory", "demo", f"DEMO_VENV={tmp_path / 'demo'}",
         *overrides],  # no "Entering directory" lines when the tests run under `make test`
        cwd=REPO, capture_output=True, text=True, timeout=30, check=True,
    )  # fmt: skip
    return done.stdout.splitlines()


def installs(commands: list[str]) -> list[str]:
    return [line for line in commands if "pip install" in line and "--upgrade pip" not in line]


def driver_here() -> bool:
    return Path("/proc/driver/nvidia/version").exists() or shutil.which("nvidia-smi") is not None


def locked_install(tmp_path: Path, lock: str) -> list[str]:
    """What the demo's venv gets: the hashed lock of `lock`, then taogpud itself, offline."""
    pip = f"{tmp_path / 'demo'}/bin/python -m pip install -q"
    return [
        f"{pip} --require-hashes --no-deps -r packaging/locks/{lock}.txt",
        f"{pip} --no-deps --no-build-isolation --no-index .",
    ]


def test_without_a_driver_the_demo_installs_taogpud_alone(tmp_path: Path) -> None:
    """No driver: the CPU lock (no CuPy, Ray, pyopencl), taogpud with no extra."""
    commands = demo_commands(tmp_path, "DEMO_EXTRAS=")
    assert installs(commands) == locked_install(tmp_path, "cpu")
    assert commands[-1] == f"{tmp_path / 'demo'}/bin/python scripts/demo.py"
    assert not any(extra in line for line in commands for extra in HEAVY_EXTRAS)
    lock = (REPO / "packaging" / "locks" / "cpu.txt").read_text().lower()
    assert not any(heavy in lock for heavy in ("\ncupy", "\nray==", "\npyopencl"))


def test_the_host_chooses_when_nothing_is_said(tmp_path: Path) -> None:
    """Nothing said: the cuda12 lock where a driver is, the CPU one elsewhere."""
    chosen = "cuda12" if driver_here() else "cpu"
    assert installs(demo_commands(tmp_path)) == locked_install(tmp_path, chosen)


def test_with_a_driver_the_demo_brings_cupy(tmp_path: Path) -> None:
    """DEMO_EXTRAS=cuda12: the lock that holds CuPy for CUDA 12."""
    assert installs(demo_commands(tmp_path, "DEMO_EXTRAS=cuda12")) == locked_install(
        tmp_path, "cuda12"
    )
    assert "cupy-cuda12x==" in (REPO / "packaging" / "locks" / "cuda12.txt").read_text()


def test_the_demo_venv_is_not_the_development_one(tmp_path: Path) -> None:
    commands = demo_commands(tmp_path, "DEMO_EXTRAS=")
    assert not any(".venv/" in line or "[dev" in line for line in commands)


def demo_homes() -> set[Path]:
    return set(Path("/tmp").glob("taogpud-demo-*"))


@pytest.mark.process
@pytest.mark.skipif(driver_here(), reason="a host with an NVIDIA driver runs the CUDA demo")
def test_the_demo_on_a_host_without_a_driver_says_so_and_leaves_nothing() -> None:
    """scripts/demo.py (what `make demo` runs) on a GPU-less host: the reason is the missing
    driver (it blamed "CuPy is not installed", which no install would fix), the trace is not
    labelled with a journalctl command that shows nothing for it, and its /tmp folder is gone
    (each run left one behind)."""
    before = demo_homes()
    done = subprocess.run(
        [sys.executable, "scripts/demo.py"],
        cwd=REPO, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "No usable GPU here: no NVIDIA driver" in done.stdout and "CuPy" not in done.stdout
    assert "journalctl" not in done.stdout
    assert '"event":"job.succeeded"' in done.stdout  # the trace itself is shown
    assert demo_homes() - before == set()
