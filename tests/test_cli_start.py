"""taogpuctl starts quickly (issue 23.4): what `status` imports and builds, not how long it takes.

The time itself is the bench's (bench/cli_start.py, a median of 10): a timed assertion here
would measure how busy the CI host is. What a test can hold is the cause of a slow start: the
heavy libraries a status call has no use for, and typer building every command's parameters.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
from conftest import RunningDaemon

from taogpud import cli

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


def test_status_imports_none_of_the_heavy_libraries(daemon: RunningDaemon) -> None:
    found = modules_after("--socket", str(daemon.socket_path), "status")
    assert found == {"code": 0, "heavy": []}


def test_status_json_imports_none_of_them_either(daemon: RunningDaemon) -> None:
    found = modules_after("--socket", str(daemon.socket_path), "status", "--json")
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
