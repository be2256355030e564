"""The hot path: `taogpuctl [--socket PATH] status [--json]` and `exec` without typer.

A script (or a prompt, or a monitoring check) calls `status` far more than anything else,
and typer with its vendored click took about half of such a call's wall time here
(bench/cli_start.py). This reads that one argv shape by hand and answers it with the same
function, the same words and the same exit codes as the typer command; any other argv —
--help, --version, --watch, a misspelling, the shell asking for completions — returns None
and goes to typer (cli/app.py), which prints what it always printed.

`exec` too (docs/programs.md): its cost is added to every program it runs. Its flags are read
here only in their plain form (`--mem 4G`, each value its own word, then `--`); anything
else (`--mem=4G`, a value typer would refuse, --help) goes to typer.

The one speed path beside typer, kept because it still matters (issue 36): measured in one
run, 30 calls each alternating (as bench/cli_start.py does, a busy 2-core host), against a
daemon, this path against typer's: `status` 128 ms wall median against 255 (CPU 41 ms
against 77), `exec -- true` 186 against 282 (CPU 53 against 82), each more than 30% saved;
`submit noop`, typer's either way, 269 against 256 (CPU 79 both). `import typer` alone (its
click, and click's inspect) costs more CPU (~33 ms) than every module this path imports
(~22 ms). Any other command is typer's, as is any shape of these two not read here.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from taogpud.cli.failures import explain
from taogpud.cli.output import report_error
from taogpud.cli.program_run import detach_program, exec_program, parse_size
from taogpud.cli.status import show_status
from taogpud.client import Client
from taogpud.errors import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK, CliError, NotHot

SOCKET_OPTION = "--socket"
SOCKET_ENV = "TAOGPUD_SOCKET"
COMPLETE_VAR = "_TAOGPUCTL_COMPLETE"  # what the completion scripts set when they ask


def run(argv: Sequence[str]) -> int | None:
    """The exit code of `status`, answered here; None when argv is not `status [--json]`."""
    if COMPLETE_VAR in os.environ:
        return None
    try:
        socket_path, words = _socket_and_words(argv)
        if words and words[0] == "exec":
            return answer_exec(socket_path, parse_exec(words[1:]))
        json_out = _status_words(words)
    except NotHot:
        return None
    return answer(socket_path, json_out)


def parse(argv: Sequence[str]) -> tuple[Path | None, bool]:
    """(the socket, --json) of `[--socket PATH | --socket=PATH] status [--json]`."""
    socket_path, words = _socket_and_words(argv)
    return socket_path, _status_words(words)


def _status_words(words: list[str]) -> bool:
    if words not in (["status"], ["status", "--json"]):
        raise NotHot
    return len(words) == 2


def _socket_and_words(argv: Sequence[str]) -> tuple[Path | None, list[str]]:
    """The socket (--socket, else $TAOGPUD_SOCKET, else None) and the words after it."""
    words = list(argv)
    socket_value: str | None = None
    if words and words[0].startswith(SOCKET_OPTION + "="):
        socket_value = words.pop(0).partition("=")[2]
    elif words and words[0] == SOCKET_OPTION and len(words) > 1:
        socket_value = words[1]
        del words[:2]
    if socket_value is not None and (not socket_value or socket_value.startswith("-")):
        raise NotHot  # typer's reading of an odd value is the one that counts
    chosen = socket_value if socket_value is not None else os.environ.get(SOCKET_ENV) or None
    return (None if chosen is None else Path(chosen)), words


# exec's options with a value, each read as typer would (its bounds: cli/programs.py)
EXEC_VALUES = {
    "--gpus": ("gpus", int, 1),
    "--device": ("device", int, 0),
    "--mem": ("mem", str, None),
    "--affinity": ("affinity", str, None),
    "--priority": ("priority", int, None),
    "--timeout": ("timeout_s", float, 0.0),
    "--name": ("name", str, None),
}
EXEC_SWITCHES = {"--share": "share", "--detach": "detach", "-d": "detach", "--json": "json"}


def parse_exec(words: list[str]) -> dict[str, Any]:
    """exec's flags up to `--`, then the program: {option: value, …, "argv": [...]}."""
    given: dict[str, Any] = {}
    while words and words[0] != "--":
        flag = words.pop(0)
        if flag in EXEC_SWITCHES and EXEC_SWITCHES[flag] not in given:
            given[EXEC_SWITCHES[flag]] = True
        elif flag in EXEC_VALUES and words and EXEC_VALUES[flag][0] not in given:
            given.update([_exec_value(flag, words.pop(0))])
        else:
            raise NotHot
    if len(words) < 2 or (given.get("device") is not None and given.get("gpus", 1) != 1):
        raise NotHot  # no program, or a combination typer words the refusal of
    return {**given, "argv": words[1:]}


def _exec_value(flag: str, text: str) -> tuple[str, Any]:
    name, kind, least = EXEC_VALUES[flag]
    if text.startswith("-") and kind is str:
        raise NotHot
    try:
        value = kind(text)
    except ValueError:
        raise NotHot from None
    if least is not None and value < least:
        raise NotHot
    return name, value


def answer_exec(socket_path: Path | None, given: dict[str, Any]) -> int:
    """`taogpuctl exec`, as the typer command runs it."""
    try:
        mem = None if "mem" not in given else parse_size(given["mem"])
    except CliError:
        raise NotHot from None
    request = {"gpus": given.get("gpus", 1), "device": given.get("device"), "mem_bytes": mem,
               "share": given.get("share", False), "affinity": given.get("affinity"),
               "priority": given.get("priority", 0), "timeout_s": given.get("timeout_s"),
               "name": given.get("name")}  # fmt: skip
    run = detach_program if given.get("detach") else exec_program
    try:
        with Client(socket_path) as client:
            return run(client, given["argv"], request, given.get("json", False))
    except Exception as exc:
        message, hint, exit_code = explain(exc)
        report_error(message, hint)
        return exit_code


def answer(socket_path: Path | None, json_out: bool) -> int:
    """Print the status; a failure as one stderr line, as typer's path would."""
    try:
        show_status(socket_path, json_out)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED  # typer: Exit(130), nothing printed
    except BrokenPipeError:
        _quiet_stdout()  # typer: a reader that went away is exit 1, nothing printed
        return EXIT_FAILED
    except Exception as exc:
        message, hint, exit_code = explain(exc)
        report_error(message, hint)
        return exit_code
    return EXIT_OK


def _quiet_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's last flush has nowhere to fail."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
