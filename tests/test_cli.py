"""taogpuctl as a user runs it: a subprocess, against a real daemon through its real socket.

Exit codes under test (DESIGN §11): 0 ok; 1 the job or check failed; 2 usage or config error
(including a submit the daemon rejects, such as an unknown task); 3 the daemon cannot be reached.
"""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud.backends.cuda.backend import driver_installed
from taogpud.cli.inputs import build_params, parse_param
from taogpud.cli.output import error_line
from taogpud.errors import CliError
from taogpud.observability import nvml
from taogpud.testing import Ctl, taogpuctl, write_pair

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("cli")

__all__ = ["Ctl", "assert_one_error_line", "json_out", "taogpuctl"]  # what other test files use

JOB_CONTRACT = {"id", "task", "status", "backend", "device", "fallback", "queue_ms", "run_ms"}
JOB_CONTRACT |= {"result", "error"}
STATUS_CONTRACT = {"backend", "fallback", "running", "queued", "max_concurrent_tasks"}
STATUS_CONTRACT |= {"config_generation", "workers"}

SEED_SETTINGS: dict[str, Any] = {
    "provider": {
        "name": "taotoken",
        "baseUrl": "https://taotoken.net/api",
        "apiKey": "${TAOTOKEN_API_KEY}",
        "timeoutMs": 60000,
        "maxRetries": 3,
    },
    "models": {"default": "claude-sonnet", "coding": "claude-sonnet", "reasoning": "claude-opus"},
    "gpu": {"backend": "cuda", "deviceId": 0, "memoryFraction": 0.85, "allowFallbackToCpu": False},
    "logging": {"level": "info", "requestTrace": True},
}
SEED_CONFIG = """\
[runtime]
device_type = "gpu"
thread_num = 4
enable_profiling = true
[backend.cuda]
enabled = true
device_id = 0
stream_count = 2
cuda_arch = "sm_89"
[backend.opencl]
enabled = false
platform_index = 0
[memory]
pool_size_mb = 4096
auto_grow = true
[api]
base_url = "https://taotoken.net/api"
api_key_env = "TAOTOKEN_API_KEY"
request_timeout_s = 60
[scheduling]
strategy = "round_robin"
max_concurrent_tasks = 8
gpu_affinity = true
"""


def assert_one_error_line(result: subprocess.CompletedProcess[str], exit_code: int) -> str:
    """The command exited with exit_code and said why in one `taogpuctl: ...` line."""
    assert result.returncode == exit_code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("taogpuctl: ")
    assert "Traceback" not in result.stderr
    return lines[0]


def json_out(result: subprocess.CompletedProcess[str]) -> Any:
    """stdout parsed as exactly one JSON document."""
    return json.loads(result.stdout)


# --- no daemon needed ----------------------------------------------------------------------


def test_param_values_parse_as_json_when_they_can() -> None:
    """`ms=50` → 50, `dtype=float64` → "float64", lists and booleans as JSON, `x=` → ""."""
    assert parse_param("ms=50") == ("ms", 50)
    assert parse_param("dtype=float64") == ("dtype", "float64")
    assert parse_param("alpha=2.5") == ("alpha", 2.5)
    assert parse_param("shape=[3,4]") == ("shape", [3, 4])
    assert parse_param("flag=true") == ("flag", True)
    assert parse_param("name=") == ("name", "")
    assert parse_param("expr=a=b") == ("expr", "a=b")


def test_size_and_seed_are_param_shortcuts() -> None:
    """--size/--seed land in params next to --param values; giving one twice is refused."""
    assert build_params(10, 3, ["dtype=float64"]) == {"size": 10, "seed": 3, "dtype": "float64"}
    with pytest.raises(CliError):
        build_params(10, None, ["size=20"])
    with pytest.raises(CliError):
        parse_param("no-equals-sign")


def test_unknown_option_is_a_usage_error() -> None:
    """An unknown flag exits 2 with one line naming it."""
    line = assert_one_error_line(taogpuctl("submit", "vector_add", "--bogus"), 2)
    assert "--bogus" in line


def test_missing_command_is_a_usage_error() -> None:
    """No command: help on stdout, one line on stderr, exit 2."""
    assert_one_error_line(taogpuctl(), 2)


def test_malformed_param_is_a_usage_error(tmp_path: Path) -> None:
    """`--param foo` (no =) exits 2 before any connection is tried."""
    result = taogpuctl("submit", "sleep", "--param", "foo", socket_path=tmp_path / "none.sock")
    assert "KEY=VALUE" in assert_one_error_line(result, 2)


def test_input_that_is_not_npy_is_a_usage_error(tmp_path: Path) -> None:
    """`--input a=FILE` with a missing or non-.npy file exits 2 and names the file."""
    (tmp_path / "a.txt").write_text("1 2 3")
    socket_path = tmp_path / "none.sock"
    not_npy = taogpuctl(
        "submit", "vector_add", "--input", f"a={tmp_path / 'a.txt'}", socket_path=socket_path
    )
    assert "a.txt is not a .npy file" in assert_one_error_line(not_npy, 2)
    missing = taogpuctl("submit", "vector_add", "--input", "a=absent.npy", socket_path=socket_path)
    assert "absent.npy" in assert_one_error_line(missing, 2)


def test_missing_socket_exits_3_with_one_clear_line(tmp_path: Path) -> None:
    """No daemon: exit 3, one line naming the socket and how to start taogpud."""
    socket_path = tmp_path / "absent.sock"
    line = assert_one_error_line(taogpuctl("status", socket_path=socket_path), 3)
    assert str(socket_path) in line
    assert "systemctl start taogpud" in line


def test_socket_from_environment(tmp_path: Path) -> None:
    """TAOGPUD_SOCKET picks the socket when --socket is absent."""
    socket_path = tmp_path / "from-env.sock"
    result = taogpuctl("list", "--json", env={"TAOGPUD_SOCKET": str(socket_path)})
    assert str(socket_path) in assert_one_error_line(result, 3)


KEY_ENV = {"TAOTOKEN_API_KEY": "sk-test-not-a-real-key"}


def test_config_validate_accepts_the_seed_pair(tmp_path: Path) -> None:
    """The setup guide's own pair validates: exit 0, ok in --json, no errors; on a host that
    cannot run CUDA (no NVIDIA driver) its one error is that, never "config ok"."""
    flags = write_pair(tmp_path, SEED_SETTINGS, SEED_CONFIG).flags()
    human = taogpuctl("config", "validate", *flags, env=KEY_ENV)
    result = taogpuctl("config", "validate", *flags, "--json", env=KEY_ENV)
    if not driver_installed():
        assert (human.returncode, result.returncode) == (2, 2), human.stdout + human.stderr
        assert "config ok" not in human.stdout
        [error] = json_out(result)["errors"]
        assert error["key"] == "gpu.backend" and "no NVIDIA driver" in error["message"]
        assert "packaging/examples/cpu" in error["fix"]
        return
    assert human.returncode == 0, human.stdout + human.stderr
    assert result.returncode == 0
    assert json_out(result)["ok"] is True
    assert json_out(result)["errors"] == []


def test_config_validate_checks_the_files_the_daemon_runs(
    module_inprocess_ctl: Ctl, module_inprocess_daemon: Any
) -> None:
    """Without --settings/--config, the files the reachable daemon runs are checked (it
    checked /etc/taogpud's, whatever the daemon read)."""
    result = module_inprocess_ctl("config", "validate", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    checked = json_out(result)["files"]
    assert str(module_inprocess_daemon.settings_path) in json.dumps(checked)
    assert str(module_inprocess_daemon.config_path) in json.dumps(checked)


def test_config_validate_reports_each_error_as_file_key_message_fix(tmp_path: Path) -> None:
    """A misspelt key and a channel mismatch: exit 2, one `file: key: message (fix: ...)` each."""
    settings = json.loads(json.dumps(SEED_SETTINGS))
    settings["gpu"]["memoryFracton"] = settings["gpu"].pop("memoryFraction")
    settings["provider"]["baseUrl"] = "https://elsewhere.example/api"
    flags = write_pair(tmp_path, settings, SEED_CONFIG).flags()
    result = taogpuctl("config", "validate", *flags, env=KEY_ENV)
    assert result.returncode == 2, result.stdout + result.stderr
    problem_lines = [line for line in result.stdout.splitlines() if "(fix: " in line]
    assert any("settings.json: gpu.memoryFracton: " in line for line in problem_lines)
    assert all(": " in line.split("(fix: ")[0] for line in problem_lines)
    assert "Traceback" not in result.stderr


def test_config_validate_json_lists_errors_with_fields(tmp_path: Path) -> None:
    """--json on a broken pair: ok false, each error has file, key, message and fix."""
    settings = json.loads(json.dumps(SEED_SETTINGS))
    settings["gpu"]["memoryFracton"] = settings["gpu"].pop("memoryFraction")
    flags = write_pair(tmp_path, settings, SEED_CONFIG).flags()
    result = taogpuctl("config", "validate", *flags, "--json", env=KEY_ENV)
    assert result.returncode == 2
    report = json_out(result)
    assert report["ok"] is False
    assert report["errors"]
    assert all({"file", "key", "message", "fix"} <= set(error) for error in report["errors"])


def test_config_validate_warning_keeps_exit_0(tmp_path: Path) -> None:
    """Differing timeouts are a warning: exit 0, printed as `file: key: warning: ...`."""
    settings = json.loads(json.dumps(SEED_SETTINGS))
    settings["provider"]["timeoutMs"] = 30000
    settings["gpu"]["allowFallbackToCpu"] = True  # a host without CUDA: a warning too, not an error
    flags = write_pair(tmp_path, settings, SEED_CONFIG).flags()
    result = taogpuctl("config", "validate", *flags, env=KEY_ENV)
    assert result.returncode == 0, result.stdout + result.stderr
    assert any(": warning: " in line and "(fix: " in line for line in result.stdout.splitlines())
    assert json_out(taogpuctl("config", "validate", *flags, "--json", env=KEY_ENV))["warnings"]


def test_config_show_offline_hides_the_key(tmp_path: Path) -> None:
    """`config show --offline` with files prints the redacted config; the key never appears."""
    flags = write_pair(tmp_path, SEED_SETTINGS, SEED_CONFIG).flags()
    result = taogpuctl("config", "show", *flags, "--json", env=KEY_ENV)
    assert result.returncode == 0, result.stderr
    assert isinstance(json_out(result), dict)
    assert KEY_ENV["TAOTOKEN_API_KEY"] not in result.stdout


def test_config_show_offline_broken_pair_is_exit_2(tmp_path: Path) -> None:
    """`config show` of a broken pair: exit 2 and one line pointing at `config validate`."""
    settings = json.loads(json.dumps(SEED_SETTINGS))
    settings["gpu"]["memoryFracton"] = 0.5
    flags = write_pair(tmp_path, settings, SEED_CONFIG).flags()
    line = assert_one_error_line(taogpuctl("config", "show", *flags, env=KEY_ENV), 2)
    assert "config validate" in line


# --- against a real daemon: the module's one, each test reading its own jobs --------------


def test_submit_wait_prints_device_and_backend(module_inprocess_ctl: Ctl) -> None:
    """`submit vector_add --size 1000000 --wait` answers device=cpu:N backend=cpu, exit 0."""
    result = module_inprocess_ctl("submit", "vector_add", "--size", "1000000", "--wait")
    assert result.returncode == 0, result.stdout + result.stderr
    line = next(line for line in result.stdout.splitlines() if line.startswith("job "))
    assert " succeeded " in line
    assert "device=cpu:" in line
    assert "backend=cpu" in line
    assert "fallback=false" in line


def test_submit_wait_json_has_every_contract_field(module_inprocess_ctl: Ctl) -> None:
    """`--wait --json`: one JSON object with id, task, status, backend, device, ... error."""
    result = module_inprocess_ctl(
        *shlex.split("submit vector_add --size 1000 --param dtype=float64 --wait --json")
    )
    assert result.returncode == 0, result.stderr
    job = json_out(result)
    assert job.keys() >= JOB_CONTRACT
    assert (job["status"], job["backend"], job["error"]) == ("succeeded", "cpu", None)
    assert job["params"]["dtype"] == "float64"
    assert job["result"]["size"] == 1000


def test_submit_without_wait_prints_the_id(module_inprocess_ctl: Ctl) -> None:
    """Without --wait: the id alone on stdout, which `show` then finds."""
    result = module_inprocess_ctl("submit", "noop")
    assert result.returncode == 0, result.stderr
    job_id = result.stdout.strip()
    shown = module_inprocess_ctl("show", job_id, "--json")
    assert json_out(shown)["id"] == job_id


def test_unknown_task_is_a_usage_error(module_inprocess_ctl: Ctl) -> None:
    """A submit the daemon rejects (unknown task) exits 2 with one line naming the task."""
    result = module_inprocess_ctl("submit", "no_such_task", "--wait")
    line = assert_one_error_line(result, 2)
    assert "no_such_task" in line


def test_invalid_params_are_a_usage_error(module_inprocess_ctl: Ctl) -> None:
    """`--param size=-5` is refused by the task's params model: exit 2, one line."""
    result = module_inprocess_ctl("submit", "vector_add", "--param", "size=-5")
    assert "size" in assert_one_error_line(result, 2)


def test_status_json_has_the_contract_fields(module_inprocess_ctl: Ctl) -> None:
    """`status --json` has backend, fallback, running, queued, caps, generation and workers."""
    result = module_inprocess_ctl("status", "--json")
    assert result.returncode == 0, result.stderr
    status = json_out(result)
    assert status.keys() >= STATUS_CONTRACT
    assert status["backend"] == "cpu"
    assert status["workers"]


def test_status_human_shows_workers(module_inprocess_ctl: Ctl) -> None:
    """Plain `status` names the backend, the upload room and quota, and one row per worker."""
    result = module_inprocess_ctl("status")
    assert result.returncode == 0, result.stderr
    assert "backend cpu" in result.stdout
    assert "cpu:0" in result.stdout
    assert "yours pending 0.0/" in result.stdout and "(quota;" in result.stdout


def test_config_status_json_has_generation_and_last_reload(module_inprocess_ctl: Ctl) -> None:
    """`config status --json` has generation and last_reload {ok, errors}."""
    result = module_inprocess_ctl("config", "status", "--json")
    assert result.returncode == 0, result.stderr
    view = json_out(result)
    assert isinstance(view["generation"], int)
    assert {"ok", "errors"} <= view["last_reload"].keys()


def test_config_show_asks_the_daemon(module_inprocess_ctl: Ctl) -> None:
    """`config show --json` without files prints the daemon's effective, redacted config."""
    result = module_inprocess_ctl("config", "show", "--json")
    assert result.returncode == 0, result.stderr
    assert isinstance(json_out(result), dict)


def test_input_and_output_round_trip(module_inprocess_ctl: Ctl, tmp_path: Path) -> None:
    """Uploaded a and b go through vector_add; the downloaded c equals a + b."""
    rng = np.random.default_rng(7)
    a, b = rng.random(1000, dtype=np.float32), rng.random(1000, dtype=np.float32)
    np.save(tmp_path / "a.npy", a)
    np.save(tmp_path / "b.npy", b)
    inputs = ["--input", f"a={tmp_path / 'a.npy'}", "--input", f"b={tmp_path / 'b.npy'}"]
    result = module_inprocess_ctl(
        "submit", "vector_add", *inputs, "--output", str(tmp_path / "out"), "--wait", "--json"
    )
    assert result.returncode == 0, result.stderr
    assert json_out(result)["saved_outputs"] == {"c": str(tmp_path / "out" / "c.npy")}
    np.testing.assert_array_equal(np.load(tmp_path / "out" / "c.npy"), a + b)


def test_result_downloads_one_output(module_inprocess_ctl: Ctl, tmp_path: Path) -> None:
    """`result ID -o FILE` saves the job's only output; without -o it prints the summary."""
    kept = ["--output", str(tmp_path / "kept")]
    submitted = module_inprocess_ctl(
        *shlex.split("submit vector_add --size 100 --wait --json"), *kept
    )
    job_id = json_out(submitted)["id"]
    saved = module_inprocess_ctl("result", job_id, "-o", str(tmp_path / "c.npy"))
    assert saved.returncode == 0, saved.stderr
    assert np.load(tmp_path / "c.npy").shape == (100,)
    summary = module_inprocess_ctl("result", job_id)
    assert summary.returncode == 0
    assert "checksum" in summary.stdout


def test_cancel_a_running_job(module_inprocess_ctl: Ctl) -> None:
    """`cancel ID` of a long sleep exits 0; waiting on it then exits 1 with status cancelled."""
    job_id = module_inprocess_ctl("submit", "sleep", "--param", "ms=60000").stdout.strip()
    cancelled = module_inprocess_ctl("cancel", job_id, "--json")
    assert cancelled.returncode == 0, cancelled.stderr
    waited = module_inprocess_ctl("wait", job_id, "--timeout", "30", "--json")
    assert waited.returncode == 1
    assert json_out(waited)["status"] == "cancelled"


def test_wait_exit_codes(module_inprocess_ctl: Ctl) -> None:
    """`wait`: 0 for a succeeded job, 1 for a timed-out job, 124 for one still running."""
    done = module_inprocess_ctl("submit", "noop").stdout.strip()
    assert module_inprocess_ctl("wait", done).returncode == 0
    timed_out = module_inprocess_ctl("submit", "sleep", "--param", "ms=30000", "--timeout", "0.2")
    waited = module_inprocess_ctl("wait", timed_out.stdout.strip(), "--timeout", "30")
    assert waited.returncode == 1
    assert "timed_out" in waited.stdout
    running = module_inprocess_ctl("submit", "sleep", "--param", "ms=30000").stdout.strip()
    still = module_inprocess_ctl("wait", running, "--timeout", "0.3")
    assert still.returncode == 124
    assert "still" in still.stderr
    assert (
        module_inprocess_ctl("cancel", running).returncode == 0
    )  # free the slot: the daemon drains on stop


def test_unknown_job_id_is_a_usage_error(module_inprocess_ctl: Ctl) -> None:
    """`show` of an id the daemon does not know exits 2 with one line."""
    assert_one_error_line(module_inprocess_ctl("show", "0000000000000000"), 2)


def test_list_tasks_and_devices(module_inprocess_ctl: Ctl) -> None:
    """`list` and `tasks` answer JSON lists holding the submitted job and sleep; `devices`
    holds the worker cpu:0 and the driver's answer (none here: `nvml` says why)."""
    job = json_out(module_inprocess_ctl("submit", "noop", "--wait", "--json"))
    listed = json_out(module_inprocess_ctl("list", "--json"))
    assert job["id"] in {job["id"] for job in listed}
    tasks = json_out(module_inprocess_ctl("tasks", "--json"))
    assert {"vector_add", "sleep"} <= {task["name"] for task in tasks}
    devices = json_out(module_inprocess_ctl("devices", "--json"))
    assert "cpu:0" in {device["device"] for device in devices["workers"]}
    assert devices["nvml"] == "ok" or devices["gpus"] == []
    human = module_inprocess_ctl("tasks")
    assert "vector_add" in human.stdout


@pytest.mark.skipif(nvml.inventory().available, reason="this host has an NVIDIA driver")
def test_devices_on_a_driverless_host_says_so_then_lists_the_workers(
    module_inprocess_ctl: Ctl,
) -> None:
    """The real no-driver path: NVML's LibraryNotFound is one line, then the workers' table."""
    result = module_inprocess_ctl("devices")
    assert result.returncode == 0, result.stderr
    assert "NVIDIA driver: none found (no NVIDIA driver on this host" in result.stdout
    assert "cpu:0" in result.stdout


# --- last, on a daemon of their own (starting one stops the module's shared one) ----------


def test_fallback_is_loud(inprocess_factory: Callable[..., Any]) -> None:
    """On CPU fallback, `submit --wait` says fallback=true and `status` warns with the reason."""
    fallback = inprocess_factory(
        settings={"gpu": {"backend": "cuda", "allowFallbackToCpu": True}},
        config={"runtime": {"device_type": "gpu"}, "backend": {"cuda": {"enabled": True}}},
    )
    ctl = fallback.ctl
    submitted = ctl("submit", "noop", "--wait")
    assert submitted.returncode == 0, submitted.stderr
    assert "fallback=true" in submitted.stdout
    assert "WARNING: " in submitted.stderr
    status = ctl("status")
    assert "fallback yes" in status.stdout
    assert "WARNING: running on CPU fallback" in status.stderr
    assert json_out(ctl("status", "--json"))["fallback"] is True


def test_interrupted_wait_says_the_job_continues(inprocess_daemon: Any) -> None:
    """Ctrl-C during `submit --wait` exits 130 with one line naming the job that still runs."""
    command = [sys.executable, "-m", "taogpud.cli", "--socket", str(inprocess_daemon.socket_path)]
    command += ["submit", "sleep", "--param", "ms=60000", "--wait"]
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        assert proc.stderr is not None
        progress = proc.stderr.readline()  # "job ID running on cpu:N (...)": the wait is on
        proc.send_signal(signal.SIGINT)
        _, rest = proc.communicate(timeout=30)
    job_id, status = progress.split()[1:3]
    assert proc.returncode == 130
    assert rest.strip() == error_line(
        f"stopped waiting; job {job_id} is still {status}",
        f"taogpuctl wait {job_id}, or taogpuctl cancel {job_id}",
    )
    with inprocess_daemon.client() as client:
        assert client.cancel(job_id)["status"] in {"running", "cancelled"}
