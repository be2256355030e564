"""taogpuctl: the command line of taogpud (typer + rich over `taogpud.client`).

Exit codes (DESIGN §11; scripts rely on them):

    0  ok
    1  the job or check failed: a waited job did not succeed, or the daemon could not do a
       well-formed request right now (queue full, draining, its own error: HTTP 429 / 5xx)
    2  usage or config error: bad flags or files, an invalid config, and every request the
       daemon rejected as wrong (HTTP 4xx: unknown task, bad params, unknown job, too large)
    3  the daemon cannot be reached (DaemonUnreachable)
    4  this user may not use the daemon's socket: not in its group (taogpu; NotInGroup)
    124  a wait's --timeout passed with the job still queued or running (as timeout(1));
       the job goes on, and `taogpuctl wait ID` picks it up again
    130  interrupted (Ctrl-C); a waited job keeps running and the line says how to find it

Errors are one line on stderr, `taogpuctl: <message> (hint: ...)`, never a traceback
(TAOGPUCTL_DEBUG=1 shows the traceback of a bug in taogpuctl itself). Every command takes
`--json` and then prints exactly one JSON document on stdout, except the streams (`trace`,
`logs --json`: one JSON document per line, NDJSON) and the views for people (`top`,
`completion`). Progress and warnings go to stderr, so stdout holds only the answer.

This module is the entry point and stays light: a plain `taogpuctl status [--json]` or
`taogpuctl exec -- PROGRAM` is answered by cli/hot.py without typer (a script's most frequent
call, and a cost added to every program; its docstring has the bench's numbers); everything
else goes to the typer app in cli/app.py, which assembles the command modules.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import NoReturn

from taogpud.cli import hot

# the contract's names, here as the docstring's table gives them
from taogpud.errors import EXIT_FAILED as EXIT_FAILED
from taogpud.errors import EXIT_INTERRUPTED as EXIT_INTERRUPTED
from taogpud.errors import EXIT_NOT_IN_GROUP as EXIT_NOT_IN_GROUP
from taogpud.errors import EXIT_OK as EXIT_OK
from taogpud.errors import EXIT_UNREACHABLE as EXIT_UNREACHABLE
from taogpud.errors import EXIT_USAGE as EXIT_USAGE
from taogpud.i18n import english_only


def main(argv: Sequence[str] | None = None) -> NoReturn:
    sys.exit(run(argv))


def run(argv: Sequence[str] | None = None) -> int:
    """Run one command; every failure becomes one stderr line and an exit code."""
    args = sys.argv[1:] if argv is None else list(argv)
    if "--json" in args:  # a document for a program: English end to end, the daemon's too
        english_only()
    code = hot.run(args)
    if code is not None:
        return code
    # here, not at the top: typer and every command module are what the hot path saves
    # (its docstring has the numbers)
    from taogpud.cli.app import run_app

    return run_app(args)
