"""Options that more than one command takes, declared once (submit, and the guide's run)."""

from __future__ import annotations

from typing import Annotated

import typer

SizeOption = Annotated[int | None, typer.Option(help="Shortcut for --param size=N.")]
SeedOption = Annotated[int | None, typer.Option(help="Shortcut for --param seed=N.")]
ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="KEY=VALUE; VALUE as JSON if it parses."),
]
