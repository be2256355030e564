"""taogpuctl's typer app, assembled: the root's options (cli/context.py), then each command
group's module in the order `taogpuctl --help` lists them; and the entry point that runs one
argv through typer (the contract is in taogpud.cli).

`taogpud.cli.run` sends here every argv the hot path (cli/hot.py) does not answer itself.

Every module here is imported at each start, so a command body imports what only it uses
(pydantic for config, the doctor, the MCP SDK, NVML, rich, http.client): each such import says
what it costs, as extra import time over this module's, min of 10 fresh interpreters on a busy
2-core host (issue 36). None breaks a cycle: the command modules import downwards only.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence

import typer

from taogpud.cli import config as cli_config
from taogpud.cli import context as cli_context
from taogpud.cli import conventions as cli_conventions
from taogpud.cli import guide as cli_guide
from taogpud.cli import helptext as cli_helptext
from taogpud.cli import jobs as cli_jobs
from taogpud.cli import logs as cli_logs
from taogpud.cli import programs as cli_programs
from taogpud.cli import relay as cli_relay
from taogpud.cli import system as cli_system
from taogpud.cli import top as cli_top
from taogpud.cli.failures import explain
from taogpud.cli.output import one_line, report_error
from taogpud.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE

app = typer.Typer(
    name="taogpuctl",
    help=cli_context.ROOT_HELP,
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
app.callback()(cli_context.global_options)

# jobs and programs
app.command("submit")(cli_jobs.submit_command)
app.command("exec", context_settings=cli_programs.EXEC_SETTINGS, no_args_is_help=True)(
    cli_programs.exec_command
)
app.command("wait")(cli_jobs.wait_command)
app.command("show")(cli_jobs.show_command)
app.command("list")(cli_jobs.list_command)
app.command("cancel")(cli_jobs.cancel_command)
app.command("result")(cli_jobs.result_command)
# the daemon and this host
app.command("status")(cli_system.status_command)
app.command("tasks")(cli_system.tasks_command)
app.command("devices")(cli_system.devices_command)
app.command("doctor")(cli_system.doctor_command)
app.command("mcp")(cli_system.mcp_command)
# the shell, the guide, the live views
app.command("completion")(cli_conventions.completion_command)
app.command("run")(cli_guide.run_command)
app.command("trace")(cli_logs.trace_command)
app.command("logs")(cli_logs.logs_command)
app.command("top")(cli_top.top_command)
# the groups
app.add_typer(cli_config.config_app, name="config")
app.add_typer(cli_relay.relay_app, name="relay")
app.add_typer(cli_system.api_app, name="api")


def run_app(argv: Sequence[str]) -> int:
    """Run one command through typer; every failure becomes one stderr line and an exit code."""
    command = typer.main.get_command(asked_app(argv))
    cli_conventions.install(command, argv)
    cli_helptext.translate(command)
    try:
        result = command.main(args=list(argv), prog_name="taogpuctl", standalone_mode=False)
    except Exception as exc:
        message, hint, exit_code = explain_any(exc)
        report_error(message, hint)
        return exit_code
    return result if isinstance(result, int) else EXIT_OK


ROOT_VALUE_OPTIONS = ("--socket",)  # the root's options that take a value


def asked_app(argv: Sequence[str]) -> typer.Typer:
    """The app with only the command argv names: typer turns every command's signature into
    click parameters at each start (~30 ms for all of them), and a call runs one. The whole
    app when argv names none, one it lacks (did-you-mean lists the others), or the shell asks
    for completions."""
    name = command_word(argv)
    if name is None or cli_conventions.COMPLETE_VAR in os.environ:
        return app
    commands = [info for info in app.registered_commands if info.name == name]
    groups = [info for info in app.registered_groups if info.name == name]
    if len(commands) + len(groups) != 1:
        return app
    asked = copy.copy(app)  # the module's app stays whole: run() may be called again
    asked.registered_commands, asked.registered_groups = commands, groups
    return asked


def command_word(argv: Sequence[str]) -> str | None:
    """The first word after the root's --socket; None at any other option first (-h,
    --version: the whole app answers them)."""
    words = iter(argv)
    for word in words:
        if word in ROOT_VALUE_OPTIONS:
            next(words, None)
        elif word.startswith(tuple(f"{option}=" for option in ROOT_VALUE_OPTIONS)):
            continue
        elif word.startswith("-"):
            return None
        else:
            return word
    return None


def explain_any(exc: Exception) -> tuple[str, str, int]:
    """(message, hint, exit code): typer's usage errors here, all else as cli/failures.py says."""
    if isinstance(exc, typer.TyperException | typer.Abort):
        return explain_usage(exc)
    return explain(exc)


def explain_usage(exc: typer.TyperException | typer.Abort) -> tuple[str, str, int]:
    """Typer's (vendored click's) parse errors: all usage errors."""
    if isinstance(exc, typer.Abort):
        return "aborted", "", EXIT_FAILED
    ctx = getattr(exc, "ctx", None)
    command_path = ctx.command_path if ctx is not None else "taogpuctl"
    # A missing sub-command has already printed the help, leaving the message empty.
    message = one_line(exc.format_message()) or f"{command_path} needs a command"
    return message, f"see `{command_path} --help`", EXIT_USAGE
