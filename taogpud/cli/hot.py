"""The hot path: `taogpuctl [--socket PATH] status [--json]` without typer.

A script (or a prompt, or a monitoring check) calls `status` far more than anything else,
and typer with its vendored click took about half of such a call's wall time here
(bench/cli_start.py). This reads that one argv shape by hand and answers it with the same
function, the same words and the same exit codes as the typer command; any other argv —
--help, --version, --watch, a misspelling, the shell asking for completions — returns None
and goes to typer (cli/app.py), which prints what it always printed.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from pathlib import Path

from taogpud.cli import EXIT_FAILED, EXIT_INTERRUPTED, EXIT_OK

SOCKET_OPTION = "--socket"
SOCKET_ENV = "TAOGPUD_SOCKET"
COMPLETE_VAR = "_TAOGPUCTL_COMPLETE"  # what the completion scripts set when they ask


class NotHot(Exception):
    """argv is not the hot path's shape: typer reads it."""


def run(argv: Sequence[str]) -> int | None:
    """The exit code of `status`, answered here; None when argv is not `status [--json]`."""
    if COMPLETE_VAR in os.environ:
        return None
    try:
        socket_path, json_out = parse(argv)
    except NotHot:
        return None
    return answer(socket_path, json_out)


def parse(argv: Sequence[str]) -> tuple[Path | None, bool]:
    """(the socket, --json) of `[--socket PATH | --socket=PATH] status [--json]`."""
    words = list(argv)
    socket_value: str | None = None
    if words and words[0].startswith(SOCKET_OPTION + "="):
        socket_value = words.pop(0).partition("=")[2]
    elif words and words[0] == SOCKET_OPTION and len(words) > 1:
        socket_value = words[1]
        del words[:2]
    if socket_value is not None and (not socket_value or socket_value.startswith("-")):
        raise NotHot  # typer's reading of an odd value is the one that counts
    if words not in (["status"], ["status", "--json"]):
        raise NotHot
    chosen = socket_value if socket_value is not None else os.environ.get(SOCKET_ENV) or None
    return (None if chosen is None else Path(chosen)), len(words) == 2


def answer(socket_path: Path | None, json_out: bool) -> int:
    """Print the status; a failure as one stderr line, as typer's path would."""
    from taogpud.cli.failures import explain
    from taogpud.cli.output import report_error
    from taogpud.cli.status import show_status

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
