"""What every command shares: the root's options (--socket) and the client they reach.

The root callback keeps the global options on the root context's object; a command reaches
the daemon with `connect(ctx)`. Output (stdout for the answer, stderr for the rest) is
cli/output.py's, the user's language taogpud.i18n's: neither depends on the context.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from taogpud.client import Client

ROOT_HELP = "Run and inspect GPU compute jobs on this host's taogpud."


@dataclass(frozen=True)
class Globals:
    socket_path: Path | None  # None: taogpud.host.paths.client_sockets() chooses


def global_options(
    ctx: typer.Context,
    socket_path: Annotated[
        Path | None,
        # readable=False: a socket's mode says nothing a connect() would not say better
        # (a user outside group taogpu gets the client's own message, not a usage error).
        typer.Option(
            "--socket",
            envvar="TAOGPUD_SOCKET",
            readable=False,
            help="The daemon's control socket (default: a daemon of your own, else "
            "/run/taogpud/taogpud.sock).",
        ),
    ] = None,
) -> None:
    """Run and inspect GPU compute jobs on this host's taogpud."""
    ctx.obj = Globals(socket_path)


def socket_of(ctx: typer.Context) -> Path | None:
    """The --socket given (or $TAOGPUD_SOCKET); None: the client chooses."""
    globals_ = ctx.find_object(Globals)
    return globals_.socket_path if globals_ else None


@contextmanager
def connect(ctx: typer.Context) -> Iterator[Client]:
    """A client of the daemon the root's options name, closed when the block ends."""
    with Client(socket_of(ctx)) as client:
        yield client
