"""taogpuctl keeps the conventions of git, docker, kubectl and timeout(1): -h, --version,
completion scripts, job-id prefixes, exit 124 for "still running", errors in flags' words."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from taogpud import __version__
from taogpud.cli.conventions import short_ids
from taogpud.cli.words import humanize, remember
from taogpud.client.ids import FULL_ID_LENGTH
from taogpud.jobs.records import new_job_id
from taogpud.testing import Ctl, InProcessDaemon, taogpuctl
from tests.test_cli import assert_one_error_line, json_out

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("cli_conventions")


def test_version_on_both_programs() -> None:
    """`taogpuctl --version` and `taogpud --version` print the package version, exit 0."""
    ctl = taogpuctl("--version")
    assert (ctl.returncode, ctl.stdout.strip()) == (0, f"taogpuctl {__version__}")
    daemon = subprocess.run(
        [sys.executable, "-m", "taogpud", "--version"], capture_output=True, text=True, check=False
    )
    assert (daemon.returncode, daemon.stdout.strip()) == (0, f"taogpud {__version__}")


@pytest.mark.parametrize("args", [["-h"], ["submit", "-h"], ["config", "validate", "-h"]])
def test_short_help_everywhere(args: list[str]) -> None:
    """`-h` prints the same help as --help, on the root and on sub-commands."""
    short, long = taogpuctl(*args), taogpuctl(*args[:-1], "--help")
    assert short.returncode == 0, short.stderr
    assert "Usage: taogpuctl" in short.stdout
    assert short.stdout == long.stdout


def test_submit_help_lists_tasks_and_an_example() -> None:
    """`submit --help` names the tasks with their descriptions, and a runnable example."""
    result = taogpuctl("submit", "--help")
    assert result.returncode == 0, result.stderr
    for name in ("vector_add", "sleep", "probe"):
        assert name in result.stdout
    assert "taogpuctl submit vector_add --size 1000000 --wait" in result.stdout


@pytest.mark.parametrize(
    ("shell", "marker"),
    [("bash", "complete -o"), ("zsh", "compdef"), ("fish", "complete --command taogpuctl")],
)
def test_completion_scripts(shell: str, marker: str) -> None:
    """`completion SHELL` prints that shell's script, wired to _TAOGPUCTL_COMPLETE."""
    result = taogpuctl("completion", shell)
    assert result.returncode == 0, result.stderr
    assert marker in result.stdout
    assert "_TAOGPUCTL_COMPLETE" in result.stdout


def test_completion_answers_commands() -> None:
    """The script's callback: bash completion of `taogpuctl su` offers `submit`."""
    env = {"_TAOGPUCTL_COMPLETE": "complete_bash", "COMP_WORDS": "taogpuctl su", "COMP_CWORD": "1"}
    result = taogpuctl(env=env)
    assert result.stdout.split() == ["submit"]


def test_unknown_shell_is_a_usage_error() -> None:
    """`completion tcsh` exits 2 with one line naming the choices."""
    assert "bash" in assert_one_error_line(taogpuctl("completion", "tcsh"), 2)


# --- the daemon's validation errors in flags' words (no daemon: the translation itself) ----


def test_located_errors_name_the_flag_and_the_value() -> None:
    """`body.priority: Input should be ≤ 1000` → `--priority must be at most 1000 (given 5000)`."""
    remember(body_priority=5000, query_status="bogus")
    assert humanize("body.priority: Input should be less than or equal to 1000") == (
        "--priority must be at most 1000 (given 5000)"
    )
    status = "query.status: Input should be 'queued', 'running' or 'failed'"
    assert humanize(status) == "--status must be one of queued, running, failed (given bogus)"
    assert humanize("no job with id 'x'") is None


def test_params_errors_speak_json_not_python() -> None:
    """`(given True)` → `(given true)`; a param is its flag (`--size`) or `--param NAME`."""
    message = (
        "invalid params for vector_add: size: Value error, expected an integer, not a boolean "
        "(given True); dtype: Input should be 'float32' or 'float64' (given 'int8')"
    )
    assert humanize(message) == (
        "invalid params for vector_add: --size must be an integer, not a boolean (given true); "
        '--param dtype must be one of float32, float64 (given "int8")'
    )


# --- against a real daemon -----------------------------------------------------------------


def test_bad_priority_and_status_in_flags_words(module_inprocess_ctl: Ctl) -> None:
    """Through the daemon: --priority 5000 and --status bogus come back in the flags' words,
    with no API location (`body.`, `query.`), pydantic phrase or API code in the line."""
    priority = assert_one_error_line(
        module_inprocess_ctl("submit", "noop", "--priority", "5000"), 2
    )
    assert priority == "taogpuctl: --priority must be at most 1000 (given 5000)"
    status = assert_one_error_line(module_inprocess_ctl("list", "--status", "bogus"), 2)
    assert status.startswith("taogpuctl: --status must be one of queued, running, ")
    assert status.endswith("(given bogus)")
    param = assert_one_error_line(
        module_inprocess_ctl("submit", "vector_add", "--param", "size=true"), 2
    )
    assert "--size must be an integer, not a boolean (given true)" in param
    for line in (priority, status, param):
        assert not {"body.", "query.", "Input should", "True", "[invalid"} & set(line.split())
        assert "body." not in line and "Input should" not in line and "(given True)" not in line


def test_tasks_show_no_python_none(module_inprocess_ctl: Ctl) -> None:
    """`tasks` prints params without a default as `(optional)`, never `=None`."""
    result = module_inprocess_ctl("tasks")
    assert result.returncode == 0, result.stderr
    assert "=None" not in result.stdout
    assert "size:integer=1000000" in result.stdout


def shared_length(a: str, b: str) -> int:
    return next(n for n in range(len(a)) if a[n] != b[n])


def test_ids_made_together_differ_within_six_characters() -> None:
    """Ids made in one burst (the same millisecond, the same second) tell themselves apart by
    their first 6 characters: the prefix a person types is unique when it is needed. (They
    began with a clock: jobs of one second shared their first 8.)"""
    ids = [new_job_id() for _ in range(200)]
    assert len({job_id[:6] for job_id in ids}) >= 199  # 24 random bits: a clash is ~1 in 1,000
    assert all(len(job_id) == FULL_ID_LENGTH and int(job_id, 16) >= 0 for job_id in ids)


def test_short_ids_are_six_or_as_long_as_unique() -> None:
    """The short form: 6 characters, longer (as git's) where two shown ids share more."""
    ids = ["1a2b3c4d5e6f70809", "1a2b3c4d5e6f70819", "ffffff00000000000"]
    assert short_ids(ids) == {
        "1a2b3c4d5e6f70809": "1a2b3c4d5e6f7080",
        "1a2b3c4d5e6f70819": "1a2b3c4d5e6f7081",
        "ffffff00000000000": "ffffff",
    }


def test_wait_still_running_is_124_and_failed_is_1(module_inprocess_ctl: Ctl) -> None:
    """`wait --timeout` with the job still running: 124 (as timeout(1)); a job that failed: 1."""
    running = module_inprocess_ctl("submit", "sleep", "--param", "ms=30000").stdout.strip()
    still = module_inprocess_ctl("wait", running, "--timeout", "0.2")
    assert still.returncode == 124, still.stderr
    assert f"job {running} is still running" in still.stderr
    assert module_inprocess_ctl("cancel", running).returncode == 0
    cancelled = module_inprocess_ctl("wait", running, "--timeout", "30")
    assert cancelled.returncode == 1


def test_show_times_carry_a_zone_and_rounded_ms(module_inprocess_ctl: Ctl) -> None:
    """`show`: `created_at: YYYY-MM-DD HH:MM:SS.mmm ZONE`; timings to 0.01 ms."""
    job_id = module_inprocess_ctl("submit", "noop", "--wait", "--json")
    shown = module_inprocess_ctl("show", json_out(job_id)["id"], env={"TZ": "UTC"})
    lines = dict(line.split(": ", 1) for line in shown.stdout.splitlines())
    date, clock, zone = lines["created_at"].split()
    assert (len(date), len(clock), zone) == (10, 12, "UTC")
    timings = json_out(subprocess.CompletedProcess([], 0, lines["timings"], ""))
    assert all(round(value, 2) == value for value in timings.values())


# --- config files named the same way everywhere ----------------------------------------------


def test_config_validate_names_the_files_it_checked(tmp_path: Path) -> None:
    """`config validate` says which files it read, and for a file not given and absent from
    the default directory, that the embedded defaults were used (and where it looked)."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"gpu": {"backend": "cpu"}}))
    config = tmp_path / "config.toml"
    config.write_text('[runtime]\ndevice_type = "cpu"\n[backend.cuda]\nenabled = false\n')
    both = taogpuctl("config", "validate", "--settings", str(settings), "--config", str(config))
    assert both.returncode == 0, both.stdout + both.stderr
    assert f"checked settings.json: {settings}" in both.stdout.splitlines()
    assert f"checked config.toml: {config}" in both.stdout.splitlines()
    alone = taogpuctl("config", "validate", "--settings", str(settings), "--json")
    files = {entry["file"]: entry for entry in json_out(alone)["files"]}
    assert files["settings.json"]["path"] == str(settings)
    if files["config.toml"]["path"] is None:  # no config.toml in this host's default directory
        looked_at = files["config.toml"]["looked_at"]
        human = taogpuctl("config", "validate", "--settings", str(settings))
        expected = f"config.toml: none at {looked_at}; used the embedded defaults"
        assert expected in human.stdout.splitlines()


def test_json_comments_are_named_as_such(tmp_path: Path) -> None:
    """A settings.json with `//` comments: `PATH: line 2, column 3: comments are not JSON`."""
    settings = tmp_path / "settings.json"
    settings.write_text('{\n  // the GPU side\n  "gpu": {"backend": "cpu"}\n}\n')
    result = taogpuctl("config", "validate", "--settings", str(settings))
    assert result.returncode == 2
    assert f"{settings}: line 2, column 3: comments are not JSON" in result.stdout


def test_every_error_names_its_file_by_path(tmp_path: Path) -> None:
    """A key error and a syntax error, one per file: both lines begin with the file's path."""
    settings = tmp_path / "settings.json"
    settings.write_text(json.dumps({"gpu": {"backend": "cpu", "deviceID": 0}}))
    config = tmp_path / "config.toml"
    config.write_text("[runtime\n")
    result = taogpuctl("config", "validate", "--settings", str(settings), "--config", str(config))
    problems = [line for line in result.stdout.splitlines() if "(fix: " in line]
    assert any(line.startswith(f"{settings}: gpu.deviceID: ") for line in problems), problems
    assert any(line.startswith(f"{config}: line 1") for line in problems), problems
    assert all(line.startswith(str(tmp_path)) for line in problems), problems


# --- last, each on a daemon of its own (starting one stops the module's shared one): they
# read every job id the daemon holds


def test_job_id_prefixes(inprocess_daemon: InProcessDaemon) -> None:
    """A unique prefix finds the job (show, wait, result, cancel); one shared by two jobs is
    an error listing both; an unknown one stays the daemon's 'no job' (exit 2)."""
    ctl = inprocess_daemon.ctl
    with inprocess_daemon.client() as client:  # 17 ids: two of them share a first character
        ids = [client.submit("noop", {}, wait_s=5)["id"] for _ in range(17)]
    pairs = [(a, b) for a in ids for b in ids if a < b]
    first, second = max(pairs, key=lambda pair: shared_length(*pair))  # the closest two
    common = shared_length(first, second)
    shown = ctl("show", second[: common + 1], "--json")
    assert shown.returncode == 0, shown.stderr
    assert json_out(shown)["id"] == second
    assert ctl("wait", first[: common + 1]).returncode == 0
    assert ctl("result", first[: common + 1]).returncode == 0
    ambiguous = assert_one_error_line(ctl("show", first[:common]), 2)
    assert f"job id prefix {first[:common]} is ambiguous" in ambiguous
    assert first in ambiguous and second in ambiguous
    assert "job_not_found" in assert_one_error_line(ctl("show", "fffff"), 2)


def test_list_shows_the_short_ids_that_find_the_jobs(inprocess_daemon: InProcessDaemon) -> None:
    """`taogpuctl list` shows each id in its short form (6 characters, more only where two
    shown ids share them), and that form is what `show` finds the job by."""
    with inprocess_daemon.client() as client:
        ids = {client.submit("noop", {}, wait_s=5)["id"] for _ in range(5)}
    listed = inprocess_daemon.ctl("list")
    assert listed.returncode == 0, listed.stderr
    shown = [line.split()[0] for line in listed.stdout.splitlines()[1:]]
    assert sorted(shown) == sorted(short_ids(sorted(ids)).values())
    assert all(len(short) >= 6 for short in shown)
    found = json_out(inprocess_daemon.ctl("show", shown[0], "--json"))["id"]
    assert found in ids and found.startswith(shown[0])
