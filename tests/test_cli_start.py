"""taogpuctl starts quickly (issue 23.4): what `status` imports and builds, not how long it takes.

The time itself is the bench's (bench/cli_start.py, a median of 10): a timed assertion here
would measure how busy the CI host is. What a test can hold is the cause of a slow start: the
heavy libraries a status call has no use for, and typer building every command's parameters.
The tests that ask a daemon share the module's one (`module_daemon`): they only read status,
and `exec -- true` runs a job of its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from taogpud.cli import app as cli
from taogpud.cli import hot
from taogpud.testing import RunningDaemon

# One worker for the module (--dist loadgroup), so that the daemon its tests share starts once.
pytestmark = pytest.mark.xdist_group("cli_start")

# pydantic(-settings) came with the config loader (through the relay's commands), rich with the
# output module, structlog with the doctor: none of them is status's, into a pipe.
HEAVY = ("pydantic", "pydantic_settings", "rich", "structlog", "httpx", "fastapi", "numpy")

PROBE = """
import sys
from taogpud.cli import run
code = run(sys.argv[1:])
import orjson
heavy = sorted({name.split(".")[0] for name in sys.modules} & set(HEAVY))
sys.stderr.write(orjson.dumps({"code": code, "heavy": heavy}).decode() + "\\n")
"""


def modules_after(*args: str) -> dict[str, object]:
    """Run taogpuctl ARGS in a fresh interpreter (stdout a pipe); its exit code and the heavy
    libraries it had imported by the end."""
    probe = f"HEAVY = {HEAVY!r}\n{PROBE}"
    done = subprocess.run(
        [sys.executable, "-c", probe, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    return dict(orjson.loads(done.stderr.strip().splitlines()[-1]))


def test_status_imports_none_of_the_heavy_libraries(module_daemon: RunningDaemon) -> None:
    found = modules_after("--socket", str(module_daemon.socket_path), "status")
    assert found == {"code": 0, "heavy": []}


def test_status_json_imports_none_of_them_either(module_daemon: RunningDaemon) -> None:
    found = modules_after("--socket", str(module_daemon.socket_path), "status", "--json")
    assert found == {"code": 0, "heavy": []}


def test_a_call_builds_only_the_command_it_names() -> None:
    asked = cli.asked_app(["--socket", "/nowhere.sock", "status", "--json"])
    assert [info.name for info in asked.registered_commands] == ["status"]
    assert asked.registered_groups == []
    assert len(cli.app.registered_commands) > 10  # the module's app stays whole


def test_a_group_is_built_alone_with_its_commands() -> None:
    asked = cli.asked_app(["--socket=/nowhere.sock", "config", "validate"])
    assert asked.registered_commands == []
    assert [info.name for info in asked.registered_groups] == ["config"]


def test_root_options_an_unknown_word_or_none_get_the_whole_app() -> None:
    for argv in ([], ["--version"], ["-h"], ["statsu"], ["--socket", "/x.sock"]):
        assert cli.asked_app(argv) is cli.app, argv


def test_an_unknown_command_still_hears_of_the_one_it_meant(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "taogpud.cli", "--socket", str(tmp_path / "s"), "statsu"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Did you mean 'status'?" in done.stderr


# --- the hot path: `status [--json]` without typer, printing what typer's command prints ----------

TYPER_PATH = """
import sys
from taogpud.cli.app import run_app
sys.exit(run_app(sys.argv[1:]))
"""
ENTRY_POINT = ("-m", "taogpud.cli")  # the console script's main: the hot path first
TYPER_ONLY = ("-c", TYPER_PATH)


def python(
    command: tuple[str, ...], *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *command, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=env,
    )


def outcome(done: subprocess.CompletedProcess[str]) -> tuple[int, str, str]:
    return done.returncode, done.stdout, done.stderr


def test_status_imports_no_typer(module_daemon: RunningDaemon) -> None:
    """`status` is answered without typer (or its vendored click) imported at all."""
    probe = 'HEAVY = ("typer", "click")\n' + PROBE
    done = python(("-c", probe), "--socket", str(module_daemon.socket_path), "status")
    assert orjson.loads(done.stderr.strip().splitlines()[-1]) == {"code": 0, "heavy": []}


def test_the_hot_path_prints_what_the_typer_command_prints(module_daemon: RunningDaemon) -> None:
    """Text and --json, over --socket and --socket=: the same stdout, stderr and exit code."""
    socket_path = str(module_daemon.socket_path)
    for args in (
        ["--socket", socket_path, "status"],
        [f"--socket={socket_path}", "status", "--json"],
    ):
        hot_path = python(ENTRY_POINT, *args)
        assert outcome(hot_path) == outcome(python(TYPER_ONLY, *args)), args
        assert hot_path.returncode == 0 and "backend" in hot_path.stdout


def test_an_absent_daemon_is_exit_3_with_the_same_line(tmp_path: Path) -> None:
    """No daemon (by --socket or TAOGPUD_SOCKET): exit 3 and one stderr line, word for word
    as typer's path says it."""
    env = {**os.environ, "TAOGPUD_SOCKET": str(tmp_path / "env.sock")}
    for args, named in (
        (["--socket", str(tmp_path / "none.sock"), "status"], "none.sock"),
        (["status", "--json"], "env.sock"),
    ):
        hot_path = python(ENTRY_POINT, *args, env=env)
        assert outcome(hot_path) == outcome(python(TYPER_ONLY, *args, env=env)), args
        assert hot_path.returncode == 3 and hot_path.stdout == "" and named in hot_path.stderr


def test_other_shapes_of_argv_go_to_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only `[--socket PATH] status [--json]` is the hot path's; typer reads the rest."""
    monkeypatch.delenv("TAOGPUD_SOCKET", raising=False)
    assert hot.parse(["status"]) == (None, False)
    assert hot.parse(["--socket", "/a.sock", "status", "--json"]) == (Path("/a.sock"), True)
    assert hot.parse(["--socket=/b.sock", "status"]) == (Path("/b.sock"), False)
    monkeypatch.setenv("TAOGPUD_SOCKET", "/env.sock")
    assert hot.parse(["status"]) == (Path("/env.sock"), False)
    assert hot.parse(["--socket", "/a.sock", "status"]) == (Path("/a.sock"), False)
    monkeypatch.setenv("TAOGPUD_SOCKET", "")  # empty: unset, as click reads it
    assert hot.parse(["status"]) == (None, False)
    others = [
        [], ["-h"], ["--version"], ["status", "-h"], ["status", "--help"], ["status", "--watch"],
        ["status", "-w"], ["status", "--json", "--json"], ["status", "--interval", "1"],
        ["statsu"], ["--socket", "status"], ["--socket", "--json", "status"],
        ["--socket=", "status"], ["status", "--socket", "/a.sock"],
        ["--socket", "/a", "--socket", "/b", "status"],
    ]  # fmt: skip
    for argv in others:
        with pytest.raises(hot.NotHot):
            hot.parse(argv)


def test_completion_requests_go_to_typer(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell asking for completions is typer's to answer, whatever the words."""
    monkeypatch.setenv(hot.COMPLETE_VAR, "complete_bash")
    assert hot.run(["status"]) is None


LEAN_PROBE = """
import json, sys
from taogpud.cli import run
code = run(sys.argv[1:])
found = {name.split(".")[0] for name in sys.modules}
found &= {"orjson", "dataclasses", "inspect", "datetime", "uuid", "typer"}
sys.stderr.write(json.dumps({"code": code, "found": sorted(found)}) + "\\n")
"""


def test_status_as_text_needs_no_orjson_nor_dataclasses(module_daemon: RunningDaemon) -> None:
    """Into a pipe, `status` decodes with the standard library's json: orjson, and the
    dataclasses, inspect, datetime and uuid it imports, are no cost of it (--json prints with
    orjson, as every command does)."""
    done = python(("-c", LEAN_PROBE), "--socket", str(module_daemon.socket_path), "status")
    assert json.loads(done.stderr.strip().splitlines()[-1]) == {"code": 0, "found": []}


def test_exec_in_its_plain_shape_is_the_hot_paths_and_the_rest_typers() -> None:
    """`exec` flags each with its value as its own word, then `--` and a program: read here
    as typer reads them; any other shape (or a value typer refuses) goes to typer."""
    given = hot.parse_exec(["--gpus", "2", "--mem", "4G", "--share", "--", "python3", "-V"])
    assert given == {"gpus": 2, "mem": "4G", "share": True, "argv": ["python3", "-V"]}
    assert hot.parse_exec(["--", "true"]) == {"argv": ["true"]}
    assert hot.parse_exec(["--priority", "-5", "-d", "--", "x"]) == {
        "priority": -5, "detach": True, "argv": ["x"]
    }  # fmt: skip
    others = [
        [], ["--"], ["true"], ["--mem=4G", "--", "x"], ["--gpus", "0", "--", "x"],
        ["--gpus", "two", "--", "x"], ["--device", "1", "--gpus", "2", "--", "x"],
        ["--timeout", "-1", "--", "x"], ["--share", "--share", "--", "x"], ["-h"],
        ["--help", "--", "x"], ["--name", "--", "x"],
    ]  # fmt: skip
    for words in others:
        with pytest.raises(hot.NotHot):
            hot.parse_exec(list(words))


def test_exec_imports_no_typer(module_daemon: RunningDaemon) -> None:
    """`exec -- true` runs and reports without typer (or click) imported."""
    probe = 'HEAVY = ("typer", "click")\n' + PROBE
    done = python(("-c", probe), "--socket", str(module_daemon.socket_path), "exec", "--", "true")
    assert orjson.loads(done.stderr.strip().splitlines()[-1]) == {"code": 0, "heavy": []}
