"""The rules that span both files (DESIGN §1), and where the API key comes from.

The two files must describe one channel and one device:

    provider.baseUrl == api.base_url            (a trailing slash aside)        error
    gpu.deviceId ∈ backend.cuda.device_id       (when the backend is cuda)      error
    gpu.deviceId ∈ backend.opencl.device_index  (when the backend is opencl)    error
    gpu.backend, runtime.device_type, backend.cuda.enabled, backend.opencl.enabled
                                                 agree on one backend           error
    provider.timeoutMs / 1000 == api.request_timeout_s                          warning

API key, first found wins: the systemd credential, the env var named by api.api_key_env, the
file's apiKey (after ${VAR} expansion). Only the source is ever reported, never the value.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import SecretStr

from taogpud.config.loading import has_reference
from taogpud.config.messages import dig
from taogpud.config.problem import Problem
from taogpud.config.shown import hide
from taogpud.i18n import Text

if TYPE_CHECKING:
    from taogpud.config import ConfigFile, KeySource, SettingsFile
    from taogpud.config.loading import Layer

SETTINGS = "settings.json"
CONFIG = "config.toml"
CREDENTIAL_NAME = "taotoken_api_key"
REDACTED = "<redacted>"

# per backend, the config.toml values that agree with it (device_type is free for OpenCL:
# a PoCL device is a CPU, a vendor one a GPU)
_AGREEING: dict[str, dict[str, Any]] = {
    "cuda": {
        "runtime.device_type": "gpu",
        "backend.cuda.enabled": True,
        "backend.opencl.enabled": False,
    },
    "cpu": {
        "runtime.device_type": "cpu",
        "backend.cuda.enabled": False,
        "backend.opencl.enabled": False,
    },
    "opencl": {"backend.cuda.enabled": False, "backend.opencl.enabled": True},
}


def check_pair(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    """Every cross-file problem (errors and warnings) of one pair."""
    from taogpud.config.ray import check_ray

    checks = (_one_channel, _device_in_set, _one_backend, _timeouts_agree, check_ray)
    return [problem for check in checks for problem in check(settings, config)]


def _one_channel(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    ours, theirs = settings.provider.base_url, config.api.base_url
    if ours.rstrip("/") == theirs.rstrip("/"):
        return []
    message = Text(
        "{ours} differs from {file} api.base_url {theirs}",
        ours=_show(ours),
        file=CONFIG,
        theirs=_show(theirs),
    )
    fix = Text(
        "give provider.baseUrl ({settings}) and api.base_url ({config}) the same URL",
        settings=SETTINGS,
        config=CONFIG,
    )
    return [Problem.of(SETTINGS, "provider.baseUrl", message, fix)]


def _device_in_set(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    device, backend = settings.gpu.device_id, settings.gpu.backend
    if backend == "cuda":
        key, allowed = "backend.cuda.device_id", config.backend.cuda.device_id
    elif backend == "opencl":  # the device's index within backend.opencl.platform_index
        key, allowed = "backend.opencl.device_index", config.backend.opencl.device_index
    else:
        return []
    if allowed == "all":
        return []
    devices = [allowed] if isinstance(allowed, int) else list(allowed)
    if device in devices:
        return []
    message = Text(
        "device {device} is not in {file} {key} {devices}",
        device=device,
        file=CONFIG,
        key=key,
        devices=_show(devices),
    )
    choices = " or ".join(str(index) for index in devices)
    fix = Text(
        "set gpu.deviceId to {choices}, or add {device} to {key}",
        choices=choices,
        device=device,
        key=key,
    )
    return [Problem.of(SETTINGS, "gpu.deviceId", message, fix)]


def _one_backend(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    backend = settings.gpu.backend
    actual = _backend_keys(config)
    disagree = [key for key, want in _AGREEING[backend].items() if actual[key] != want]
    if not disagree:
        return []
    found = ", ".join(f"{key} = {_show(actual[key])}" for key in disagree)
    message = Text(
        '"{backend}" disagrees with {file} {found}', backend=backend, file=CONFIG, found=found
    )
    shown = ["cpu", "cuda"] + (["opencl"] if backend == "opencl" else [])
    fix = "; ".join(_agreeing_text(name) for name in shown)  # keys and values: as written
    return [Problem.of(SETTINGS, "gpu.backend", message, Text(fix))]


def blame_the_change(
    problems: list[Problem],
    settings: SettingsFile,
    config: ConfigFile,
    previous_backend: str | None,
) -> list[Problem]:
    """On a reload (`previous_backend`: the gpu.backend in force), a backend mismatch is
    named where the change was made: settings.json kept its backend, so config.toml's keys
    moved (it named settings.json gpu.backend, the file nobody touched)."""
    if previous_backend is None or previous_backend != settings.gpu.backend:
        return problems
    return [
        _config_side(settings, config) if (p.file, p.key) == (SETTINGS, "gpu.backend") else p
        for p in problems
    ]


def _config_side(settings: SettingsFile, config: ConfigFile) -> Problem:
    backend, actual = settings.gpu.backend, _backend_keys(config)
    disagree = [key for key, want in _AGREEING[backend].items() if actual[key] != want]
    found = ", ".join(f"{key} = {_show(actual[key])}" for key in disagree)
    message = f'{found} disagrees with {SETTINGS} gpu.backend "{backend}"'
    fix = f"{_agreeing_text(backend)}; or change gpu.backend in {SETTINGS} to match"
    return Problem(CONFIG, disagree[0], message, fix)


def _backend_keys(config: ConfigFile) -> dict[str, Any]:
    return {
        "runtime.device_type": config.runtime.device_type,
        "backend.cuda.enabled": config.backend.cuda.enabled,
        "backend.opencl.enabled": config.backend.opencl.enabled,
    }


def _agreeing_text(backend: str) -> str:
    values = ", ".join(f"{key} = {_show(want)}" for key, want in _AGREEING[backend].items())
    return f'for {backend}: gpu.backend = "{backend}", {values}'


def _timeouts_agree(settings: SettingsFile, config: ConfigFile) -> list[Problem]:
    ours_s, theirs_s = settings.provider.timeout_ms / 1000, config.api.request_timeout_s
    if math.isclose(ours_s, theirs_s):
        return []
    message = Text(
        "{ms} ms differs from {file} api.request_timeout_s = {seconds} s; each side would give "
        "up at a different time",
        ms=settings.provider.timeout_ms,
        file=CONFIG,
        seconds=format(theirs_s, "g"),
    )
    fix = Text(
        "set provider.timeoutMs to {ms} or api.request_timeout_s to {seconds}",
        ms=format(theirs_s * 1000, "g"),
        seconds=format(ours_s, "g"),
    )
    return [Problem.of(SETTINGS, "provider.timeoutMs", message, fix, severity="warning")]


def _show(value: Any) -> str:
    return hide(json.dumps(value))  # true/false and "quoted" strings, as both files write them


# ---- the API key ----------------------------------------------------------------------

_KEY_PATH = ("provider", "api_key")


def resolve_api_key(
    settings: SettingsFile,
    layer: Layer[SettingsFile],
    config: ConfigFile,
    *,
    environ: Mapping[str, str],
    problems: list[Problem],
) -> tuple[SecretStr | None, KeySource]:
    """(key, source), first found wins: credential, the env var named by api.api_key_env, the
    file's apiKey ("env" when it came from a ${VAR} reference or an override, else "file")."""
    credential = read_credential(environ, problems)
    if credential:
        return SecretStr(credential), "credential"
    named = environ.get(config.api.api_key_env, "")
    if named:
        return SecretStr(named), "env"
    if settings.provider.api_key.get_secret_value():
        return settings.provider.api_key, "file" if _literal_key(layer) else "env"
    return None, "none"


def read_credential(environ: Mapping[str, str], problems: list[Problem]) -> str:
    """The systemd credential (LoadCredential=taotoken_api_key), or "" if there is none."""
    directory = environ.get("CREDENTIALS_DIRECTORY")
    if not directory:
        return ""
    path = Path(directory) / CREDENTIAL_NAME
    try:
        return path.read_text(encoding="utf-8").rstrip("\r\n")
    except FileNotFoundError:
        return ""
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or "not UTF-8 text"
        fix = "check LoadCredential=taotoken_api_key in the unit and the file it names"
        problems.append(Problem(str(path), CREDENTIAL_NAME, f"cannot be read: {reason}", fix))
        return ""


def _literal_key(layer: Layer[SettingsFile]) -> bool:
    """Whether settings.json itself holds the key: a non-empty apiKey with no ${VAR} in it
    (and no env override replacing it)."""
    provider = layer.document.get("provider")
    raw = provider.get("api_key") if isinstance(provider, dict) else None
    overridden = layer.override_var(_KEY_PATH) is not None
    return isinstance(raw, str) and bool(raw) and not has_reference(raw) and not overridden


def key_problems(layer: Layer[SettingsFile]) -> list[Problem]:
    """A literal apiKey is readable by anyone who can read the file: warn, never show it."""
    if not _literal_key(layer):
        return []
    message = Text("holds a literal API key in plain text (value not shown)")
    fix = Text(
        "move the key to the systemd credential taotoken_api_key (LoadCredential=) or to the env "
        'var named by api.api_key_env, and write "apiKey": "${{TAOTOKEN_API_KEY}}"'
    )
    return [Problem.of(SETTINGS, "provider.apiKey", message, fix, severity="warning")]


# Scrubbing is the second line of defence (no message shows the apiKey field at all). Values
# this short are no real key, and replacing them would garble ordinary words.
_MIN_SCRUBBED = 8


def scrub(
    problems: list[Problem], keys: list[str | SecretStr | None], layer: Layer[SettingsFile]
) -> list[Problem]:
    """The problems with every value that is or may be the key replaced by <redacted>: the
    resolved key, the key env var, the apiKey as expanded (even where validation failed), and
    anything shaped like a key or a URL's userinfo (the key typed into another field)."""
    expanded = dig(layer.merged, _KEY_PATH)
    candidates = [*keys, expanded if isinstance(expanded, str) else None]
    secrets = [_plain(value) for value in candidates]
    secrets = [value for value in secrets if len(value) >= _MIN_SCRUBBED]

    def clean(text: str) -> str:
        return hide(text, secrets)

    return [p.cleaned(clean) for p in problems]


def _plain(value: str | SecretStr | None) -> str:
    if isinstance(value, SecretStr):
        return value.get_secret_value()
    return value or ""
