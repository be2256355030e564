"""How one config file becomes one validated model, with every problem written down.

    find it (resolve_paths) → read → parse → check its keys (did-you-mean) → prepare (${VAR})
    → layer env overrides on it (pydantic-settings' EnvSettingsSource) → validate
    → pydantic's errors become Problems that name the file, the key, the value and the fix

Nothing here knows the keys of either file: config.py describes each file as a FileKind.
"""

from __future__ import annotations

import json
import os
import re
import stat
import tomllib
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Literal, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsError

from taogpud.config.messages import (
    MISSING,
    KeyPath,
    did_you_mean,
    dig,
    section_type,
    translate,
    unknown_key,
)
from taogpud.config.problem import Problem
from taogpud.i18n import Text

M = TypeVar("M", bound=BaseSettings)

_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_TOML_POSITION = re.compile(r"\s*\(at (?:line (\d+), column (\d+)|end of document)\)$")


def _unchanged(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    return data


@dataclass(frozen=True)
class FileKind(Generic[M]):
    """One of the two files: its label, model, syntax and how its keys are spelled."""

    label: str  # "settings.json"
    model: type[M]
    syntax: Literal["json", "toml"]
    spell: Callable[[str], str]  # field name → key as the file spells it
    point_at: str  # how a user names the file: "--settings or TAOGPUD_SETTINGS"
    prepare: Callable[[dict[str, Any], Mapping[str, str]], dict[str, Any]] = _unchanged
    # Whether messages may quote the file's content (its key names and values): only when the
    # path read is a regular file, the one the message names. A symlink's target is another
    # file (any the daemon can read, /etc/shadow as well): its content is never repeated.
    quote: bool = True

    def shown_key(self, path: Sequence[str], tail: str) -> str:
        """An unknown key from the file, as a message may name it."""
        return self.key(path, tail if self.quote else "(a key not shown)")

    @property
    def env_prefix(self) -> str:
        return str(self.model.model_config.get("env_prefix") or "")

    def key(self, path: Sequence[str], tail: str | None = None) -> str:
        """A dotted key as the file spells it; `tail` is appended as given (an unknown key)."""
        parts = [self.spell(name) for name in path]
        return ".".join([*parts, tail] if tail is not None else parts)

    def env_var(self, path: Sequence[str]) -> str:
        return self.env_prefix + "__".join(path).upper()


@dataclass(frozen=True)
class Layer(Generic[M]):
    """One file after all its layers: the model (None if it failed) and where values came from."""

    model: M | None
    document: dict[str, Any]  # the file's known keys in field names, before prepare (raw ${VAR})
    merged: dict[str, Any]  # what was validated: prepared file data with env overrides on top
    env_data: dict[str, Any] = field(default_factory=dict)
    overrides: dict[KeyPath, str] = field(default_factory=dict)  # key path → env var setting it

    def override_var(self, path: KeyPath) -> str | None:
        """The env var that supplied the value at `path`, if one did."""
        if dig(self.env_data, path) is MISSING:
            return None
        setting = [(len(p), var) for p, var in self.overrides.items() if path[: len(p)] == p]
        return max(setting)[1] if setting else None


# ---- paths --------------------------------------------------------------------------------


def default_config_dir(environ: Mapping[str, str], *, system: bool) -> Path:
    """$CONFIGURATION_DIRECTORY (systemd), /etc/taogpud for root, else $XDG_CONFIG_HOME/taogpud."""
    # systemd's ConfigurationDirectory= names the directory itself (first of a ':' list);
    # honoured like RUNTIME_DIRECTORY and STATE_DIRECTORY in paths.py
    if environ.get("CONFIGURATION_DIRECTORY"):
        return Path(environ["CONFIGURATION_DIRECTORY"].split(":")[0])
    if system:
        return Path("/etc/taogpud")
    xdg = environ.get("XDG_CONFIG_HOME", "")
    if not Path(xdg).is_absolute():  # the XDG spec says to ignore relative values
        home = environ.get("HOME") or str(Path.home())
        xdg = str(Path(home) / ".config")
    return Path(xdg) / "taogpud"


def pick_path(
    given: Path | None, environ: Mapping[str, str], env_names: Sequence[str], default: Path
) -> tuple[Path | None, bool]:
    """(path, explicit): the argument, else the first env var set, else the default if present."""
    if given is not None:
        return Path(given), True
    for name in env_names:
        if environ.get(name):
            return Path(environ[name]).expanduser(), True
    # lexists: a dangling symlink at the default path is reported, not mistaken for "no file"
    return (default if os.path.lexists(default) else None), False


# ---- one layer ----------------------------------------------------------------------------


def read_layer(
    kind: FileKind[M], path: Path | None, environ: Mapping[str, str], problems: list[Problem]
) -> Layer[M]:
    """The file at `path` (None: embedded defaults) with env overrides, validated."""
    try:
        return _read_layer(kind, path, environ, problems)
    except RecursionError:  # a document nested thousands deep; json and tomllib recurse
        where = kind.label if path is None else str(path)
        problems.append(Problem(where, kind.label, "is nested too deeply", "flatten it"))
        return Layer(None, {}, {})


def _read_layer(
    kind: FileKind[M], path: Path | None, environ: Mapping[str, str], problems: list[Problem]
) -> Layer[M]:
    kind = replace(kind, quote=path is None or _is_regular(path))
    document = {} if path is None else _read_document(kind, path, problems)
    checked = check_keys(kind, document or {}, problems)
    overrides, env_data = _env_layer(kind, environ, problems)
    merged = deep_merge(kind.prepare(checked, environ), env_data)
    layer = Layer[M](None, checked, merged, env_data, overrides)
    model = _validate(kind, layer, problems)
    # a file that could not be read is not "the defaults": no model, so no cross-file checks
    return replace(layer, model=model) if document is not None else layer


def _is_regular(path: Path) -> bool:
    """Whether `path` itself (not what a link there points at) is a regular file."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (OSError, ValueError):
        return False


def _validate(kind: FileKind[M], layer: Layer[M], problems: list[Problem]) -> M | None:
    try:
        return kind.model(**layer.merged)
    except ValidationError as exc:
        problems.extend(translate(kind, exc.errors(), layer))
        return None


# ---- reading and parsing ------------------------------------------------------------------


def _read_document(kind: FileKind[M], path: Path, problems: list[Problem]) -> dict[str, Any] | None:
    text = _read_text(kind, path, problems)
    if text is None:
        return None
    parse = _parse_json if kind.syntax == "json" else _parse_toml
    return parse(text, str(path), kind.label, problems)


def _read_text(kind: FileKind[M], path: Path, problems: list[Problem]) -> str | None:
    where = str(path)
    unusable = Text(
        "point {flag} at a readable file, or unset it for the embedded defaults",
        flag=kind.point_at,
    )
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        create = Text("create it, or {unusable}", unusable=unusable)
        problems.append(Problem.of(where, kind.label, Text("does not exist"), create))
        return None
    except IsADirectoryError:
        directory = Text("is a directory, not a file")
        problems.append(Problem.of(where, kind.label, directory, unusable))
        return None
    except PermissionError:
        fix = Text("make it readable by the daemon's user (e.g. root:taogpu 0640)")
        denied = Text("cannot be read: permission denied")
        problems.append(Problem.of(where, kind.label, denied, fix))
        return None
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        problems.append(Problem(where, kind.label, f"cannot be read: {reason}", unusable))
        return None
    return _decode(kind, where, data, problems)


def _decode(kind: FileKind[M], where: str, data: bytes, problems: list[Problem]) -> str | None:
    if not data.strip():
        fix = Text(
            "restore its content (a truncated save?), or delete it for the {file} defaults",
            file=kind.label,
        )
        problems.append(Problem.of(where, kind.label, Text("is empty"), fix))
        return None
    try:
        return data.decode("utf-8-sig")  # -sig: a BOM from a Windows editor is harmless
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        not_utf8 = Text("is not UTF-8 text")
        problems.append(Problem.of(where, f"line {line}", not_utf8, Text("save the file as UTF-8")))
        return None


class _JsonObject(dict[str, Any]):
    """A JSON object that remembers keys given twice (json.loads keeps the last, silently)."""

    duplicates: tuple[str, ...] = ()

    @classmethod
    def from_pairs(cls, pairs: list[tuple[str, Any]]) -> _JsonObject:
        obj = cls(pairs)
        counts = Counter(key for key, _ in pairs)
        obj.duplicates = tuple(sorted(key for key, count in counts.items() if count > 1))
        return obj


def _parse_json(
    text: str, where: str, label: str, problems: list[Problem]
) -> dict[str, Any] | None:
    fix = "correct the JSON there (double quotes, commas between items, none after the last)"
    try:
        document = json.loads(text, object_pairs_hook=_JsonObject.from_pairs)
    except json.JSONDecodeError as exc:  # msg names the token, never the document's content
        position = f"line {exc.lineno}, column {exc.colno}"
        problems.append(Problem(where, position, *_json_complaint(text, exc, label, fix)))
        return None
    except ValueError as exc:  # e.g. a number over Python's 4300-digit limit
        problems.append(Problem(where, label, f"invalid JSON: {exc}", fix))
        return None
    if not isinstance(document, dict):
        got = type(document).__name__
        fix = 'wrap the settings in one object: { "provider": {...}, "gpu": {...} }'
        problems.append(Problem(where, "line 1", f"must be a JSON object, not {got}", fix))
        return None
    return document


def _json_complaint(text: str, exc: json.JSONDecodeError, label: str, fix: str) -> tuple[str, str]:
    """(message, fix); a `//` or `/* */` comment (JSONC, as editors allow) said as such."""
    if text.startswith(("//", "/*"), exc.pos):
        return (
            f"comments are not JSON: {label} is read as strict JSON, without `//` or `/* */`",
            "delete the comment (keep notes in a file beside it)",
        )
    return f"invalid JSON: {_json_reason(exc.msg)}{_cut_short(text, exc)}", fix


def _json_reason(reason: str) -> str:
    """json's words, whole: "Unterminated string starting at" (the position follows in the
    key) reads "unterminated string (it starts there)"."""
    if reason.endswith(" starting at"):
        return reason.removesuffix(" starting at").lower() + " (it starts there)"
    return reason


def _cut_short(text: str, exc: json.JSONDecodeError) -> str:
    """Said when the error is at the end of the text: the file stops inside the document."""
    if exc.msg.startswith("Unterminated string") or exc.pos >= len(text.rstrip()):
        return "; the file ends before the JSON does: was it cut short?"
    return ""


def _parse_toml(
    text: str, where: str, label: str, problems: list[Problem]
) -> dict[str, Any] | None:
    fix = "correct the TOML there (quoted strings, key = value, each key once per table)"
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:  # 3.11 has no lineno: it sits in the message
        message = str(exc)
        found = _TOML_POSITION.search(message)
        position = "end of document"
        if found and found.group(1):
            position = f"line {found.group(1)}, column {found.group(2)}"
        reason = message[: found.start()] if found else message
        problems.append(Problem(where, position, f"invalid TOML: {reason}", fix))
        return None
    except ValueError as exc:
        problems.append(Problem(where, label, f"invalid TOML: {exc}", fix))
        return None


# ---- keys ---------------------------------------------------------------------------------


def check_keys(
    kind: FileKind[M], document: dict[str, Any], problems: list[Problem]
) -> dict[str, Any]:
    """The document with keys renamed to field names; unknown and repeated keys reported."""
    return _checked_keys(kind, kind.model, document, (), problems)


def _checked_keys(
    kind: FileKind[M],
    model: type[BaseModel],
    document: dict[str, Any],
    path: KeyPath,
    problems: list[Problem],
) -> dict[str, Any]:
    by_spelling = {kind.spell(name): name for name in model.model_fields}
    for repeated in getattr(document, "duplicates", ()):
        fix = "keep one of them: only the last would count"
        problems.append(Problem(kind.label, kind.shown_key(path, repeated), "is given twice", fix))
    checked: dict[str, Any] = {}
    for key, value in document.items():
        name = by_spelling.get(key)
        if name is None:
            problems.append(unknown_key(kind, path, key, list(by_spelling)))
            continue
        section = section_type(model.model_fields[name])
        if section is not None and isinstance(value, dict):
            checked[name] = _checked_keys(kind, section, value, (*path, name), problems)
        else:
            checked[name] = value  # a section that is no dict is left for pydantic to report
    return checked


# ---- ${VAR} -------------------------------------------------------------------------------


def expand(tree: Any, environ: Mapping[str, str]) -> Any:
    """${VAR} and ${VAR:-default} in every string of `tree`, with the shell's rules:
    unset ${VAR} is ""; ${VAR:-d} is d when VAR is unset or empty. One pass, no recursion."""
    if isinstance(tree, str):
        return _REFERENCE.sub(lambda found: _substitute(found, environ), tree)
    if isinstance(tree, dict):
        return {key: expand(value, environ) for key, value in tree.items()}
    if isinstance(tree, list):
        return [expand(item, environ) for item in tree]
    return tree


def _substitute(found: re.Match[str], environ: Mapping[str, str]) -> str:
    name, default = found.group(1), found.group(2)
    value = environ.get(name, "")
    return default if default is not None and not value else value


def has_reference(text: str) -> bool:
    return _REFERENCE.search(text) is not None


# ---- env overrides ------------------------------------------------------------------------


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' own env source, reading a given mapping instead of os.environ."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # read by _load_env_vars, which the base __init__ calls
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        # case_sensitive=False: the source looks names up lower-cased
        return {name.lower(): value for name, value in self._environ.items()}


def _env_layer(
    kind: FileKind[M], environ: Mapping[str, str], problems: list[Problem]
) -> tuple[dict[KeyPath, str], dict[str, Any]]:
    """(key path → var, nested values) for the valid overrides; the invalid are reported.

    The source itself skips a misspelt top-level name without a word and fails a whole
    section on one bad JSON value, so each name is checked against the model first.
    """
    prefix = kind.env_prefix
    overrides: dict[KeyPath, str] = {}
    for var, value in environ.items():
        if not var.upper().startswith(prefix):  # TAOGPUD_SETTINGS (a path) has no "__"
            continue
        path = tuple(var[len(prefix) :].lower().split("__"))
        problem = _check_override(kind, var, path, value)
        if problem is not None:
            problems.append(problem)
        else:
            overrides[path] = var
    return overrides, _run_env_source(kind, environ, overrides, problems)


def _run_env_source(
    kind: FileKind[M],
    environ: Mapping[str, str],
    overrides: dict[KeyPath, str],
    problems: list[Problem],
) -> dict[str, Any]:
    if not overrides:
        return {}
    usable = {var: environ[var] for var in overrides.values()}
    try:
        return _EnvironSource(kind.model, usable)()
    except SettingsError as exc:  # checked for above; kept so nothing else escapes load()
        fix = f"check the {kind.env_prefix}* variables"
        problems.append(Problem(kind.label, kind.env_prefix + "*", str(exc), fix))
        return {}


def _check_override(kind: FileKind[M], var: str, path: KeyPath, value: str) -> Problem | None:
    model: type[BaseModel] = kind.model
    for depth, segment in enumerate(path):
        fields = model.model_fields
        if segment not in fields:
            return _unknown_override(kind, var, path, depth, list(fields))
        section = section_type(fields[segment])
        is_last = depth == len(path) - 1
        if section is None:
            return None if is_last else _unknown_override(kind, var, path, depth + 1, [])
        if is_last:
            return _check_section_json(kind, var, path, value)
        model = section
    return None


def _unknown_override(
    kind: FileKind[M], var: str, path: KeyPath, depth: int, valid: list[str]
) -> Problem:
    """`path[depth]` is not a key at that level (`valid` empty: the path goes on below a
    single value). The fix names the variable as it should have been spelt."""
    known, rest = path[:depth], path[depth:]
    match = did_you_mean(rest[0], valid) if valid else None
    if match:
        fix = f"did you mean {kind.env_var((*known, match, *rest[1:]))}?"
    elif valid:
        fix = f"unset {var}; the keys there are " + ", ".join(valid)
    else:
        fix = f"unset {var}; {kind.key(known)} is a single value, set as {kind.env_var(known)}"
    key = kind.key(known, kind.spell(rest[0]) if valid else None) or kind.label
    return Problem(kind.label, key, f"{var} overrides no such key", fix)


def _check_section_json(kind: FileKind[M], var: str, path: KeyPath, value: str) -> Problem | None:
    try:
        is_object = isinstance(json.loads(value), dict)
    except (ValueError, RecursionError):
        is_object = False
    if is_object:
        return None
    # the value is not shown: a section such as provider may hold the API key
    fix = f"give {var} a JSON object of snake_case keys, or set one key as {var}__KEY"
    return Problem(kind.label, kind.key(path), f"{var} must hold a JSON object", fix)


def deep_merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    """`top` over `base`, merging nested dicts (an override of one key keeps its siblings)."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(below, dict) and isinstance(value, dict):
            merged[key] = deep_merge(below, value)
        else:
            merged[key] = value
    return merged
