"""Options that more than one command takes, declared once."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

SizeOption = Annotated[int | None, typer.Option(help="Shortcut for --param size=N.")]
SeedOption = Annotated[int | None, typer.Option(help="Shortcut for --param seed=N.")]
ParamOption = Annotated[
    list[str] | None,
    typer.Option("--param", "-p", help="KEY=VALUE; VALUE as JSON if it parses."),
]
JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document.")]
SettingsFlag = Annotated[Path | None, typer.Option("--settings", help="The settings.json to use.")]
ConfigFlag = Annotated[Path | None, typer.Option("--config", help="The config.toml to use.")]
