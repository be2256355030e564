"""What operators expect of a command line from their other tools (git, docker, kubectl, pueue).

- `-h` as well as `--help`, on every command (git, docker);
- `--version` (every tool);
- `taogpuctl completion bash|zsh|fish` prints the completion script (kubectl, gh, docker);
- a job id may be shortened to any unique prefix (git, docker); an ambiguous one is an error
  listing the candidates (taogpud/client/ids.py: the MCP tools take one too);
- exit 124 when a wait gave up with the job still running (as timeout(1) does), so a script
  can tell "not finished yet" from "the job failed" (1).
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Sequence
from enum import StrEnum
from typing import Annotated, Any

import typer
import typer.completion
from typer.core import TyperOption

from taogpud import __version__
from taogpud.cli.hot import COMPLETE_VAR as COMPLETE_VAR  # noqa: PLC0414 (named here too)

SHORT_ID_LENGTH = 6  # what tables show (docker's 12, git's 7: 24 random bits here)

# typer's own completion scripts and the classes that answer them: its public module imports
# them without re-exporting them by name (so, for mypy, Any); `import typer` imports it anyway
TYPER_COMPLETION: Any = typer.completion

SUBMIT_EXAMPLES = """\
Examples:

  taogpuctl submit vector_add --size 1000000 --wait

  taogpuctl submit sleep --param ms=500 --priority 10

  taogpuctl submit vector_add --input a=a.npy --input b=b.npy -o out/ --wait
"""


def install(command: Any, argv: Sequence[str]) -> None:
    """Add -h and --version to the root command; give `submit --help` its task list."""
    command.context_settings["help_option_names"] = ["-h", "--help"]
    command.params.append(
        TyperOption(
            param_decls=["--version"],
            is_flag=True,
            expose_value=False,
            is_eager=True,
            callback=_print_version,
            help="Print taogpuctl's version and exit.",
        )
    )
    if COMPLETE_VAR in os.environ:  # the shell asks for completions: typer's classes answer
        TYPER_COMPLETION.completion_init()
    # "submit" in the group: a call builds only the command it names (taogpud.cli.asked_app)
    if "submit" in argv and ({"-h", "--help"} & set(argv)) and "submit" in command.commands:
        command.commands["submit"].epilog = submit_epilog()


def _print_version(ctx: Any, _param: Any, value: bool) -> None:
    if value and not ctx.resilient_parsing:
        typer.echo(f"taogpuctl {__version__}")
        raise typer.Exit(0)


def submit_epilog() -> str:
    """The tasks this host's taogpud knows (its registry, built-ins and plug-ins) and examples."""
    from taogpud import tasks  # the registry and its plug-ins: ~380 ms, `submit --help` only

    lines = [f"  {task.name:<11} {task.description}" for task in tasks.all_tasks()]
    return "Tasks (params: taogpuctl tasks):\n\n" + "\n\n".join(lines) + "\n\n" + SUBMIT_EXAMPLES


# --- completion --------------------------------------------------------------------------


class Shell(StrEnum):
    bash = "bash"
    zsh = "zsh"
    fish = "fish"


def completion_command(
    shell: Annotated[Shell, typer.Argument(help="bash, zsh or fish.")],
) -> None:
    """Print the shell completion script, e.g. `source <(taogpuctl completion bash)`.

    Installed for good: `taogpuctl completion bash > /etc/bash_completion.d/taogpuctl`,
    `taogpuctl completion zsh > "${fpath[1]}/_taogpuctl"`,
    `taogpuctl completion fish > ~/.config/fish/completions/taogpuctl.fish`.
    """
    script = TYPER_COMPLETION.get_completion_script(
        prog_name="taogpuctl", complete_var=COMPLETE_VAR, shell=shell.value
    )
    typer.echo(str(script))


# --- job ids -----------------------------------------------------------------------------


def short_ids(ids: Sequence[str]) -> dict[str, str]:
    """Each id's short form among `ids`: its first SHORT_ID_LENGTH characters, or as many
    more as set it apart from the others shown (as git abbreviates). A prefix shared with a
    job not shown is still refused as ambiguous by resolve_id (client/ids.py), never taken
    for the wrong one."""
    ordered = sorted(set(ids))
    shared = [_common_length(a, b) for a, b in itertools.pairwise(ordered)]
    lengths = [max([0, *shared[max(i - 1, 0) : i + 1]]) + 1 for i in range(len(ordered))]
    return {
        job_id: job_id[: max(length, SHORT_ID_LENGTH)]
        for job_id, length in zip(ordered, lengths, strict=True)
    }


def _common_length(a: str, b: str) -> int:
    return next(
        (n for n, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
