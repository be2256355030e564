"""`taogpuctl relay env --tool X --write`: a recipe merged into the tool's own config file.

The file is read, the relay's entry merged into it (everything else kept: the user's keys, and
in TOML their comments, through tomlkit), the old file kept beside it as FILE.bak, and the new
one put in place atomically with the old one's mode (0600 for a new file: OpenClaw's holds the
token). Client side only.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit
import tomlkit.exceptions

from taogpud.errors import CliError


def codex_path(environ: Mapping[str, str]) -> Path:
    home = environ.get("CODEX_HOME") or str(Path.home() / ".codex")
    return Path(home) / "config.toml"


def openclaw_path(environ: Mapping[str, str]) -> Path:
    explicit = environ.get("OPENCLAW_CONFIG_PATH")
    return Path(explicit) if explicit else Path.home() / ".openclaw" / "openclaw.json"


def write_codex(path: Path, config: Mapping[str, Any]) -> None:
    """Set model_provider, model, the [model_providers.NAME] and [mcp_servers.NAME] tables;
    keep the rest (other providers and servers among them)."""
    document = tomlkit.document()
    if path.exists():
        try:
            document = tomlkit.parse(path.read_text())
        except tomlkit.exceptions.ParseError as exc:
            raise _unreadable(path, "TOML", exc) from None
    for key, value in config.items():
        if not isinstance(value, dict):
            document[key] = value
            continue
        group = document.setdefault(key, tomlkit.table(is_super_table=True))
        for name, table in value.items():
            group[name] = table
    _replace(path, tomlkit.dumps(document))


def write_openclaw(path: Path, entry: Mapping[str, Any]) -> None:
    """Set models.providers.NAME and mcp.servers.NAME; keep the rest. OpenClaw also reads
    JSON5: a file with comments is refused rather than rewritten without them."""
    document: dict[str, Any] = {}
    if path.exists():
        try:
            document = json.loads(path.read_text() or "{}")
        except ValueError as exc:
            raise _unreadable(path, "plain JSON", exc) from None
    for top, groups in entry.items():  # {"models": {"providers": {NAME: …}}, "mcp": …}
        for group, named in groups.items():
            document.setdefault(top, {}).setdefault(group, {}).update(named)
    _replace(path, json.dumps(document, indent=2) + "\n", secret=True)


def _replace(path: Path, text: str, secret: bool = False) -> None:
    """`secret`: the file holds the token, so it (and its backup) is the owner's alone."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    mode = 0o600
    if path.exists():
        mode = path.stat().st_mode & (0o700 if secret else 0o777)
        backup = path.with_name(path.name + ".bak")
        shutil.copy2(path, backup)
        backup.chmod(mode)
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as out:
        os.fchmod(out.fileno(), mode)
        out.write(text)
    Path(staging).replace(path)


def _unreadable(path: Path, kind: str, exc: Exception) -> CliError:
    return CliError(
        f"{path} is not {kind} that taogpuctl can merge into ({exc})",
        "merge the entry `taogpuctl relay env --tool TOOL` prints (without --write) by hand",
    )
