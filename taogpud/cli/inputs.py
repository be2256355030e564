"""What `submit` (and the guide's `run`) send: params from flags, .npy inputs uploaded first."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from taogpud.client import NPY_MAGIC, Client
from taogpud.errors import CliError
from taogpud.i18n import _


def parse_param(item: str) -> tuple[str, Any]:
    """`KEY=VALUE`; the value as JSON when it parses (`ms=50` → 50), else the text."""
    key, sep, raw = item.partition("=")
    if not sep or not key.strip():
        bad = _("--param {item} is not KEY=VALUE").format(item=repr(item))
        raise CliError(bad, _("e.g. --param ms=50"))
    try:
        return key.strip(), orjson.loads(raw)
    except orjson.JSONDecodeError:
        return key.strip(), raw


def build_params(size: int | None, seed: int | None, items: Sequence[str]) -> dict[str, Any]:
    params = dict(parse_param(item) for item in items)
    for name, value in (("size", size), ("seed", seed)):
        if value is None:
            continue
        if name in params:
            raise CliError(
                _("{name} given twice").format(name=name),
                _("use either --{name} or --param {name}=").format(name=name),
            )
        params[name] = value
    return params


def read_npy(name_and_file: str) -> tuple[str, bytes]:
    """`NAME=FILE.npy` → the name and the file's bytes, checked to be a .npy file."""
    name, sep, file_name = name_and_file.partition("=")
    if not sep or not name or not file_name:
        bad = _("--input {item} is not NAME=FILE.npy").format(item=repr(name_and_file))
        raise CliError(bad, _("e.g. --input a=a.npy"))
    try:
        data = Path(file_name).read_bytes()
    except OSError as exc:
        reason = exc.strerror or exc
        raise CliError(
            _("cannot read {file}: {reason}").format(file=file_name, reason=reason)
        ) from exc
    if not data.startswith(NPY_MAGIC):
        not_npy = _("{file} is not a .npy file").format(file=file_name)
        raise CliError(not_npy, _("write it with numpy.save"))
    return name, data


def upload_inputs(client: Client, items: Sequence[str]) -> dict[str, str]:
    files = [read_npy(item) for item in items]  # every file read before any upload
    return {name: client.upload_array(data)["id"] for name, data in files}
