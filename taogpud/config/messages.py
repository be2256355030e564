"""How a config problem is worded: pydantic's errors, unknown keys and did-you-mean.

Every Problem says which file and key (spelled as in that file), what was given (never the API
key), what is allowed and the fix. A value set by an env override names its variable.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal, get_args, get_origin

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import ErrorDetails, PydanticUndefined

from taogpud.config.problem import Problem
from taogpud.i18n import Text

if TYPE_CHECKING:
    from taogpud.config.loading import FileKind, Layer

KeyPath = tuple[str, ...]  # a key path in field names: ("backend", "cuda", "device_id")
MISSING: Any = object()  # what dig() finds where a path leads nowhere
_SHOWN_CHARS = 80


def unknown_key(kind: FileKind[Any], path: KeyPath, key: str, valid: list[str]) -> Problem:
    match = did_you_mean(key, valid) if kind.quote else None
    if match:
        fix = Text('did you mean "{match}"?', match=match)
    else:
        fix = Text("remove it; valid here: {valid}", valid=", ".join(valid))
    return Problem.of(kind.label, kind.shown_key(path, key), Text("unknown key"), fix)


def did_you_mean(key: str, valid: Sequence[str]) -> str | None:
    """The valid key closest to `key`, ignoring case and separators (memory_fraction ≈
    memoryFraction), if one is close enough."""
    folded = {_fold(name): name for name in valid}
    if _fold(key) in folded:
        return folded[_fold(key)]
    close = difflib.get_close_matches(_fold(key), list(folded), n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def _fold(key: str) -> str:
    return key.lower().replace("_", "").replace("-", "")


def section_type(info: FieldInfo) -> type[BaseModel] | None:
    """The model of a section field (gpu, backend.cuda); None for a single value."""
    annotation = info.annotation
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    return None


def translate(kind: FileKind[Any], errors: list[ErrorDetails], layer: Layer[Any]) -> list[Problem]:
    """One Problem per key: a union (device_id) fails once per member, the user sees one."""
    grouped: dict[KeyPath, list[ErrorDetails]] = {}
    problems: list[Problem] = []
    for error in errors:
        path = _field_path(kind.model, error["loc"])
        if error["type"] == "extra_forbidden":  # only from a JSON override: files are checked
            problems.append(_extra_key(kind, path, error["loc"], layer))
        else:
            grouped.setdefault(path, []).append(error)
    for path, group in grouped.items():
        problems.append(_problem_for(kind, path, _most_specific(group), layer))
    return problems


def _field_path(model: type[BaseModel], loc: tuple[int | str, ...]) -> KeyPath:
    """The leading field names of `loc`, without union tags ('constrained-int') or indices."""
    path: list[str] = []
    current: type[BaseModel] | None = model
    for part in loc:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            break
        path.append(part)
        current = section_type(current.model_fields[part])
    return tuple(path)


def _field_info(model: type[BaseModel], path: KeyPath) -> FieldInfo | None:
    info: FieldInfo | None = None
    current: type[BaseModel] | None = model
    for name in path:
        if current is None:
            return None
        info = current.model_fields[name]
        current = section_type(info)
    return info


def _model_at(model: type[BaseModel], path: KeyPath) -> type[BaseModel] | None:
    if not path:
        return model
    info = _field_info(model, path)
    return section_type(info) if info is not None else None


def _most_specific(group: list[ErrorDetails]) -> ErrorDetails:
    # our own checks (utm_*, duplicate devices) say more than "not an int" from a union member
    ours = [error for error in group if "fix" in error.get("ctx", {})]
    return (ours or group)[0]


def _extra_key(
    kind: FileKind[Any], path: KeyPath, loc: tuple[int | str, ...], layer: Layer[Any]
) -> Problem:
    name = str(loc[len(path)]) if len(loc) > len(path) else "?"
    section = _model_at(kind.model, path)
    valid = list(section.model_fields) if section is not None else []
    match = did_you_mean(name, valid)
    var = layer.override_var(path) or kind.env_prefix + "*"
    if match:
        fix = Text('did you mean "{match}"?', match=match)
    else:
        fix = Text("valid here: {valid}", valid=", ".join(valid))
    message = Text("unknown key (set by {var})", var=var)
    return Problem.of(kind.label, kind.key(path, name), message, fix)


def _problem_for(
    kind: FileKind[Any], path: KeyPath, error: ErrorDetails, layer: Layer[Any]
) -> Problem:
    info = _field_info(kind.model, path)
    key = kind.key(path) if path else kind.label
    var = layer.override_var(path)
    secret = info is not None and info.annotation is SecretStr
    given = _show(dig(layer.merged, path), whole=info is None or section_type(info) is None)
    if not kind.quote and var is None:
        given = "a value (not shown: the path is a link to another file)"
    origin = _origin(var, given, secret)
    ctx = error.get("ctx", {})
    if "fix" in ctx:
        fix = str(ctx["fix"]) + (f" (in {var})" if var else "")
        return Problem(kind.label, key, f"{origin}: {error['msg']}", fix)  # our validators' own
    allowed = _allowed_text(kind, info)
    if var:
        fixed = Text("correct or unset {var}", var=var)
    else:
        note = _default_note(info)
        fixed = Text("set {key} to {allowed}{note}", key=key, allowed=allowed, note=note)
    message = Text("{origin}, expected {allowed}", origin=origin, allowed=allowed)
    return Problem.of(kind.label, key, message, fixed)


def _origin(var: str | None, given: str, secret: bool) -> Text:
    """Where the wrong value came from and what it was (the API key: never shown)."""
    if secret:
        return (
            Text("{var} is invalid", var=var) if var else Text("the value (not shown) is invalid")
        )
    return (
        Text("{var} gives {given}", var=var, given=given)
        if var
        else Text("got {given}", given=given)
    )


def _allowed_text(kind: FileKind[Any], info: FieldInfo | None) -> str:
    """What a valid value looks like: the field's own words, else read off its type."""
    if info is None:
        return "a valid value"
    extra = info.json_schema_extra
    if isinstance(extra, dict) and "allowed" in extra:
        return str(extra["allowed"])
    section = section_type(info)
    if section is not None:
        return "a section of keys " + ", ".join(kind.spell(name) for name in section.model_fields)
    return _describe(info.annotation, info.metadata)


def _describe(annotation: Any, metadata: list[Any]) -> str:
    if annotation is bool:
        return "true or false"
    if get_origin(annotation) is Literal:
        choices = [json.dumps(choice) for choice in get_args(annotation)]
        return " or ".join(choices) if len(choices) == 2 else "one of " + ", ".join(choices)
    bounds = {name: getattr(m, name) for m in metadata for name in _BOUNDS if hasattr(m, name)}
    if annotation is str:
        return "a non-empty string" if bounds.get("min_length") else "a string"
    noun = "an integer" if annotation is int else "a number"
    if "gt" in bounds:
        above = f"{noun} above {bounds['gt']}"
        return f"{above} and at most {bounds['le']}" if "le" in bounds else above
    if "ge" in bounds:
        low, high = bounds["ge"], bounds.get("le")
        return f"{noun} of {low} or more" if high is None else f"{noun} from {low} to {high}"
    return noun


_BOUNDS = ("gt", "ge", "le", "min_length")
_TYPE_WORDS = {list: "list", str: "string", int: "number", float: "number", bool: "boolean"}


def _default_note(info: FieldInfo | None) -> str:
    default = info.default if info is not None else PydanticUndefined
    if isinstance(default, bool | int | float | str):
        return f"; the default is {json.dumps(default)}"
    return ""


def dig(tree: Any, path: KeyPath) -> Any:
    """The value at `path` in nested dicts, or MISSING."""
    for name in path:
        if not isinstance(tree, dict) or name not in tree:
            return MISSING
        tree = tree[name]
    return tree


def _show(value: Any, *, whole: bool = True) -> str:
    """A value as JSON/TOML would write it, cut short: what the user gave, recognisably.
    Not `whole` (a section of the wrong type): only its type, as a section such as provider
    could hold the API key."""
    if value is MISSING:
        return "nothing"
    if not whole:
        return "a " + _TYPE_WORDS.get(type(value), type(value).__name__)
    try:
        text = json.dumps(value, ensure_ascii=False, default=str)
    except (ValueError, TypeError, RecursionError):
        text = type(value).__name__
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 1] + "…"
