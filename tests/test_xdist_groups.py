"""The suite relies on `--dist loadgroup` keeping each xdist_group on one worker (the systemd
containers, the local Ray, the PoCL cache): a pytest or pytest-xdist that silently stops
grouping (pytest 9.2 did, pytest-xdist issue 1386) must fail here, not as broken containers."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

GROUPED = """
import os, pytest
pytestmark = pytest.mark.xdist_group("together")
@pytest.mark.parametrize("n", range(6))
def test_member(n):
    print("WORKER", os.environ["PYTEST_XDIST_WORKER"])
"""


@pytest.mark.process
def test_loadgroup_keeps_a_group_on_one_worker(tmp_path: Path) -> None:
    """Six tests of one group, two workers: every one reports the same worker."""
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    xdist_group: xdist's\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-s",
         "-p", "no:cacheprovider", str(tmp_path)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    if done.returncode != 0:
        pytest.fail(done.stdout[-3000:] + done.stderr[-2000:])
    workers = {line.split()[0] for line in done.stdout.splitlines() if "PASSED" in line}
    assert len(workers) == 1, done.stdout[-3000:]
