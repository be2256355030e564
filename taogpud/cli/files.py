"""Which config files a command read: `config validate` names them, or says it used the
embedded defaults and where it looked."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any


def checked_files(
    settings: Path | None, config: Path | None, environ: Mapping[str, str]
) -> list[dict[str, Any]]:
    """One entry per file: {file, path (None: embedded defaults), looked_at}."""
    from taogpud.config import resolve_paths  # here: pydantic costs every other command time
    from taogpud.config.loading import default_config_dir
    from taogpud.host.paths import user_mode

    settings_at, config_at, _, _ = resolve_paths(settings, config, environ=environ)
    directory = default_config_dir(environ, system=not user_mode())
    return [
        {
            "file": label,
            "path": None if at is None else str(at),
            "looked_at": str(directory / label),
        }
        for label, at in (("settings.json", settings_at), ("config.toml", config_at))
    ]


def checked_lines(files: list[dict[str, Any]]) -> list[str]:
    """`checked settings.json: PATH`, or `settings.json: none at PATH, embedded defaults used`."""
    return [
        f"checked {entry['file']}: {entry['path']}"
        if entry["path"] is not None
        else f"{entry['file']}: none at {entry['looked_at']}; used the embedded defaults"
        for entry in files
    ]
