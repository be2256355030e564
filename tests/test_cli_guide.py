"""The setup guide's checks with the guide's own flags, against a real daemon."""

from __future__ import annotations

from typing import Any

import pytest

from taogpud.cli.guide import emit_evidence
from taogpud.testing import Ctl
from tests.test_cli import assert_one_error_line, json_out

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("cli_guide")


def test_guide_run_with_its_own_flags(
    module_inprocess_ctl: Ctl, module_inprocess_daemon: Any
) -> None:
    """`run --config "$OPENCLAW_CONFIG" --task vector_add --size 1000000` with the daemon's own
    config.toml: exit 0, `device=cpu:N backend=cpu` on the line, no warning."""
    config = str(module_inprocess_daemon.home / "config.toml")
    result = module_inprocess_ctl(
        "run", "--config", config, "--task", "vector_add", "--size", "1000000"
    )
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("job "))
    assert " succeeded task=vector_add device=cpu:" in line
    assert " backend=cpu " in line
    assert "WARNING" not in result.stderr
    as_json = json_out(module_inprocess_ctl("run", "--task", "noop", "--json"))
    assert as_json["status"] == "succeeded"


def test_guide_run_warns_when_the_daemon_reads_other_files(
    module_inprocess_ctl: Ctl, tmp_path: Any
) -> None:
    """`run --config OTHER`: the job runs, and a warning says the daemon used its own file."""
    other = tmp_path / "config.toml"
    other.write_text("[runtime]\n")
    result = module_inprocess_ctl("run", "--config", str(other), "--task", "noop")
    assert result.returncode == 0, result.stderr
    assert f"not {other}: this job says nothing about {other}" in result.stderr


@pytest.mark.parametrize("flag", ["--config", "--settings"])
def test_guide_run_with_a_file_that_is_not_there_is_a_usage_error(
    module_inprocess_ctl: Ctl, flag: str
) -> None:
    """`run --config /nonexistent.toml` (a mistyped $OPENCLAW_CONFIG): exit 2 naming the path,
    and no job run, so the guide's check cannot pass on a file nobody read (it warned and
    exited 0)."""
    result = module_inprocess_ctl("run", flag, "/nonexistent.toml", "--task", "noop")
    line = assert_one_error_line(result, 2)
    assert "/nonexistent.toml" in line and "no such file" in line
    assert "job " not in result.stdout


def test_show_evidence_on_cpu_says_there_is_none(module_inprocess_ctl: Ctl) -> None:
    """`show ID --evidence` of a CPU job: the device and backend, and why there is no NVML."""
    job_id = json_out(module_inprocess_ctl("submit", "noop", "--wait", "--json"))["id"]
    result = module_inprocess_ctl("show", job_id, "--evidence")
    assert result.returncode == 0, result.stderr
    assert f"job {job_id} device=cpu:" in result.stdout
    assert "no NVML evidence: the job ran on cpu" in result.stdout


def test_evidence_lines_pair_each_fact_with_nvidia_smi(capsys: pytest.CaptureFixture[str]) -> None:
    """Evidence as a CUDA worker records it (fed: no GPU here): each known fact is followed
    by the nvidia-smi query that shows it."""
    job = {
        "id": "1a2",
        "device": "gpu:0",
        "backend": "cuda",
        "evidence": {"source": "nvml", "gpu_uuid": "GPU-1234", "pid_seen_on_gpu": True},
    }
    emit_evidence(job, json_out=False)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "job 1a2 device=gpu:0 backend=cuda"
    uuid_at = next(n for n, line in enumerate(lines) if "GPU-1234" in line)
    assert "nvidia-smi --query-gpu=uuid" in lines[uuid_at + 1]
    assert "--query-compute-apps=pid" in lines[-1]


def test_evidence_shows_each_xid_beside_the_kernel_log_query(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A program's XIDs (fed: no GPU here): one line each, then the query that shows the same
    in the kernel's log; none seen says so."""
    xid = {"xid": 79, "gpu": "gpu:0", "uuid": "GPU-1234", "at": "2026-12-04T21:00:00Z"}
    job = {"id": "1a2", "device": "gpu:0", "backend": "cuda", "evidence": {"xid_errors": [xid]}}
    emit_evidence(job, json_out=False)
    lines = capsys.readouterr().out.splitlines()
    assert (
        "xid_errors" in lines[1]
        and "XID 79 on gpu:0 (GPU-1234) at 2026-12-04T21:00:00Z" in lines[1]
    )
    assert "journalctl -k | grep -i xid" in lines[2] and "dmesg" in lines[2]
    job["evidence"] = {"xid_errors": []}
    emit_evidence(job, json_out=False)
    assert "xid_errors  none" in capsys.readouterr().out
