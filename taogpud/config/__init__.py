"""Both config files → one frozen, validated ConfigSnapshot.

settings.json (the AI-tool side, camelCase keys) and config.toml (the scheduler side, snake_case
keys) are read as the setup guide writes them. Each is built from three layers, lowest first:

    embedded defaults (the seed)  →  the file  →  env overrides
                                                  TAOGPUD_SETTINGS__GPU__MEMORY_FRACTION=0.5
                                                  TAOGPUD_CONFIG__SCHEDULING__MAX_CONCURRENT_TASKS=3

This module holds the models (the keys and their limits), the snapshot, load() and diff().
loading.py turns one file into one model, messages.py words its problems, and
rules.py holds the rules that span both files and where the API key comes from.
load() collects every problem before it raises one ConfigError; warnings ride on the snapshot.
The API key never appears in a Problem, a repr, redacted() or diff().
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import parse_qsl, urlsplit

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, SecretStr
from pydantic.alias_generators import to_camel
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from taogpud.config.loading import FileKind, default_config_dir, expand, pick_path, read_layer
from taogpud.config.problem import Problem
from taogpud.config.rules import (
    REDACTED,
    blame_the_change,
    check_pair,
    key_problems,
    resolve_api_key,
    scrub,
)
from taogpud.config.shown import hide_tree, shaped_in
from taogpud.errors import ConfigError
from taogpud.host.paths import user_mode

KeySource = Literal["credential", "env", "file", "none"]

DEFAULT_URL = "https://taotoken.net/api"
DEFAULT_API_KEY_REF = "${TAOTOKEN_API_KEY}"

# Changing one of these needs new workers (the daemon rolls them one device at a time); every
# other key applies live. Spelled as in its file, like the keys diff() reports.
RESTART_KEYS: frozenset[str] = frozenset(
    {
        "backend.cuda.device_id",
        "gpu.backend",
        "runtime.device_type",
        "backend.cuda.enabled",
        "backend.cuda.stream_count",
        "backend.cuda.cuda_arch",
        "memory.pool_size_mb",
        "memory.auto_grow",
        "runtime.thread_num",
        "runtime.cpu_devices",
        "gpu.deviceId",
        # beyond the brief: an OpenCL worker binds its platform at start. (gpu.memoryFraction
        # applies live: workers take a new cap and apply it in each slot thread.)
        "backend.opencl.enabled",
        "backend.opencl.platform_index",
        "backend.opencl.device_index",
        # the executor and its Ray cluster (issue 10): new actors for the worker keys; the
        # executor itself, the address and the namespace take effect at the next start, and a
        # reload says so (config.ray.restart_only)
        "scheduling.executor",
        "ray.address",
        "ray.namespace",
        "ray.worker_num_gpus",
        "ray.worker_num_cpus",
        "ray.worker_resources",
        "ray.local_num_gpus",
        "ray.local_num_cpus",
    }
)


# ---- value types --------------------------------------------------------------------------


def _allowed(text: str) -> JsonDict:
    """Field metadata for error messages ("expected …") where the constraints cannot say it."""
    return {"allowed": text}


def _not_bool(value: object) -> object:
    # pydantic's lax mode reads `true` as 1; in a config file that is a slip, not a number
    if isinstance(value, bool):
        raise ValueError("a boolean is not a number")
    return value


def _normalise_level(value: object) -> object:
    if isinstance(value, str):
        level = value.strip().lower()
        return "warning" if level == "warn" else level
    return value


def check_api_url(url: str) -> str:
    try:
        parts = urlsplit(url)
        scheme, host, query = parts.scheme, parts.hostname, parse_qsl(parts.query)
    except ValueError:  # e.g. an unclosed "[" of an IPv6 host
        scheme, host, query = "", None, []
    if scheme not in ("http", "https") or not host:
        fix = {"fix": f"use an http(s) URL like {DEFAULT_URL}"}
        raise PydanticCustomError("api_url", "is not an http(s) URL with a host", fix)
    if parts.username is not None or parts.password is not None:
        # aiohttp refuses a URL's credentials beside the Authorization it sets (every relayed
        # request was a 500), and the provider's key has one home: the credential or apiKey
        fix = {"fix": "remove the user:password@ part; the provider's key goes in apiKey"}
        raise PydanticCustomError("url_userinfo", "carries credentials (user:password@)", fix)
    tracking = ", ".join(sorted({name for name, _ in query if name.lower().startswith("utm_")}))
    if tracking:
        message = "carries {params}; API calls must not carry utm_* tracking parameters"
        raise PydanticCustomError(
            "utm_params", message, {"params": tracking, "fix": f"remove {tracking} from it"}
        )
    return url


def _distinct(ids: tuple[int, ...]) -> tuple[int, ...]:
    if len(set(ids)) != len(ids):
        fix = {"fix": "list each device index once"}
        raise PydanticCustomError("duplicate_device", "lists a device more than once", fix)
    return ids


Int = Annotated[int, BeforeValidator(_not_bool)]
Number = Annotated[float, BeforeValidator(_not_bool)]
Name = Annotated[str, Field(min_length=1)]
ApiUrl = Annotated[
    str, AfterValidator(check_api_url), Field(json_schema_extra=_allowed("an http(s) URL"))
]
LogLevel = Annotated[
    Literal["debug", "info", "warning", "error", "critical"], BeforeValidator(_normalise_level)
]
DeviceIndex = Annotated[int, BeforeValidator(_not_bool), Field(ge=0)]
Amount = Annotated[float, BeforeValidator(_not_bool), Field(ge=0)]  # of a Ray resource
RayAddress = Annotated[
    str,
    Field(
        pattern=r"^(local|auto|(ray://)?[A-Za-z0-9_.\-]+:[0-9]{1,5})$",
        json_schema_extra=_allowed('"local", "auto", "ray://HOST:PORT" or a GCS "HOST:PORT"'),
    ),
]
DeviceSet = (
    DeviceIndex
    | Annotated[tuple[DeviceIndex, ...], Field(min_length=1), AfterValidator(_distinct)]
    | Literal["all"]
)

# Sections forbid unknown keys (load() reports them first, with a did-you-mean; this is the
# backstop for models built directly), are immutable, and keep inputs out of error strings.
_SECTION = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False, hide_input_in_errors=True)


# ---- settings.json ------------------------------------------------------------------------


class ProviderSection(BaseModel):
    model_config = _SECTION
    name: Name = "taotoken"
    base_url: ApiUrl = DEFAULT_URL
    # holds the value after ${VAR} expansion; SecretStr keeps it out of reprs and dumps
    api_key: SecretStr = Field(
        SecretStr(DEFAULT_API_KEY_REF), json_schema_extra=_allowed("a string")
    )
    timeout_ms: Int = Field(60000, ge=1)
    max_retries: Int = Field(3, ge=0, le=20)


class ModelsSection(BaseModel):
    model_config = _SECTION
    default: Name = "claude-sonnet"
    coding: Name = "claude-sonnet"
    reasoning: Name = "claude-opus"


class GpuSection(BaseModel):
    model_config = _SECTION
    backend: Literal["cuda", "cpu", "opencl"] = "cuda"
    device_id: DeviceIndex = 0
    memory_fraction: Number = Field(0.85, gt=0, le=1)
    allow_fallback_to_cpu: bool = False
    # A program (taogpuctl exec) not seen on any GPU it was given by then runs on the CPU:
    # stopped, or flagged fallback=true with allowFallbackToCpu (docs/programs.md).
    first_use_timeout_s: Number = Field(60.0, gt=0, le=86400)


class LoggingSection(BaseModel):
    model_config = _SECTION
    level: LogLevel = "info"  # any case, and "warn", are accepted
    request_trace: bool = True
    # also append the trace to this file (0600), where the guide's `grep backend FILE` looks;
    # for a user-mode daemon without journald. None: stdout / journald only.
    file: Path | None = None


class _LayeredSettings(BaseSettings):
    """What both files share: env overrides as PREFIX__SECTION__KEY, strict, immutable."""

    model_config = SettingsConfigDict(
        env_nested_delimiter="__",
        case_sensitive=False,
        extra="forbid",
        frozen=True,
        allow_inf_nan=False,
        hide_input_in_errors=True,
    )

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # load() runs pydantic-settings' env source itself, over the environ it is given, so
        # that each error can name its variable, and passes the merged layers in. A bare
        # SettingsFile() is therefore the embedded defaults, whatever the process env holds.
        return (init_settings,)


class SettingsFile(_LayeredSettings):
    """settings.json. Fields are snake_case; load() maps the file's camelCase onto them."""

    model_config = SettingsConfigDict(env_prefix="TAOGPUD_SETTINGS__")
    provider: ProviderSection = ProviderSection()
    models: ModelsSection = ModelsSection()
    gpu: GpuSection = GpuSection()
    logging: LoggingSection = LoggingSection()


# ---- config.toml --------------------------------------------------------------------------


class RuntimeSection(BaseModel):
    model_config = _SECTION
    device_type: Literal["gpu", "cpu"] = "gpu"
    thread_num: Int = Field(4, ge=1)
    enable_profiling: bool = True
    cpu_devices: Int = Field(
        1,
        ge=1,
        le=64,
        description=(
            "taogpud extension: how many devices the CPU backend presents (cpu:0 … cpu:N-1), "
            "so that placement, affinity and per-device caps can be exercised without GPUs"
        ),
    )


class CudaSection(BaseModel):
    model_config = _SECTION
    enabled: bool = True
    device_id: DeviceSet = Field(
        0, json_schema_extra=_allowed('an index (0 or more), a list of distinct indices, or "all"')
    )
    stream_count: Int = Field(2, ge=1, le=64)
    cuda_arch: str = Field(
        "sm_89",
        pattern=r"^(auto|sm_\d{2,3}[a-z]?)$",
        json_schema_extra=_allowed('"auto" or an architecture like "sm_89"'),
    )
    allow_user_kernels: bool = Field(
        False,
        description=(
            "taogpud extension: accept the `kernel` task (CUDA C from clients, built for "
            "cuda_arch); off by default, since a kernel runs any code on the GPU"
        ),
    )


class OpenclSection(BaseModel):
    model_config = _SECTION
    enabled: bool = False
    platform_index: Int = Field(0, ge=0)
    # taogpud extension: which devices of that platform get a worker (`clinfo -l` lists them)
    device_index: DeviceSet = Field(
        0, json_schema_extra=_allowed('an index (0 or more), a list of distinct indices, or "all"')
    )


class BackendSection(BaseModel):
    model_config = _SECTION
    cuda: CudaSection = CudaSection()
    opencl: OpenclSection = OpenclSection()


class MemorySection(BaseModel):
    model_config = _SECTION
    pool_size_mb: Int = Field(4096, ge=0)
    auto_grow: bool = True
    # taogpud extension: all uploaded arrays together, finished or in progress (arrays.py);
    # absent = half of /dev/shm, at most 8 GiB; never more than /dev/shm holds
    array_budget_mb: Int | None = Field(
        None,
        ge=1,
        json_schema_extra=_allowed("a whole number of MiB above 0, or no key at all"),
    )
    # taogpud extension: each user's pending uploads (arrays.py); absent = a quarter of the
    # array budget (half of /dev/shm, at most 8 GiB)
    upload_quota_mb: Int | None = Field(
        None,
        ge=1,
        json_schema_extra=_allowed("a whole number of MiB above 0, or no key at all"),
    )


class ApiSection(BaseModel):
    model_config = _SECTION
    base_url: ApiUrl = DEFAULT_URL
    api_key_env: str = Field(
        "TAOTOKEN_API_KEY",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        json_schema_extra=_allowed("an environment variable name like TAOTOKEN_API_KEY"),
    )
    request_timeout_s: Number = Field(60, gt=0)


class SchedulingSection(BaseModel):
    model_config = _SECTION
    strategy: Literal["round_robin", "least_loaded"] = "round_robin"
    max_concurrent_tasks: Int = Field(8, ge=1)
    gpu_affinity: bool = True
    queue_limit: Int = Field(1000, ge=1)  # queued jobs beyond this are refused (queue_full)
    drain_timeout_s: Number = Field(30, ge=0)  # how long a stop waits for running jobs
    job_timeout_s: Number | None = Field(
        None,
        gt=0,
        description="default timeout for jobs that give none; absent = no timeout",
        json_schema_extra=_allowed("a number above 0, or no key at all for no timeout"),
    )
    # where the warm workers live: spawned processes here, or Ray actors (the [ray] table)
    executor: Literal["local", "ray"] = "local"
    # a detached program's output, kept by the daemon as its log (docs/programs.md): at most
    # this many KiB a program; past it the rest is dropped, and the log says so
    program_log_kb: Int = Field(16384, ge=1)


class RaySection(BaseModel):
    """taogpud extension: the Ray cluster, read only when scheduling.executor = "ray"."""

    model_config = _SECTION
    address: RayAddress = "auto"
    namespace: Name = "taogpud"
    worker_num_gpus: Number = Field(1, ge=0, le=64)  # per actor: 1 = one actor per GPU
    worker_num_cpus: Number = Field(1, ge=0, le=1024)
    worker_resources: dict[Name, Amount] = Field(
        default_factory=dict, json_schema_extra=_allowed("a table like {taogpu = 1}")
    )
    local_num_gpus: Int | None = Field(None, ge=0)  # address = "local" only: logical GPUs
    local_num_cpus: Int | None = Field(None, ge=1)
    connect_timeout_s: Number = Field(30, gt=0)  # ray.init; an unreachable cluster fails here
    ready_timeout_s: Number = Field(300, gt=0)  # an actor placed and warm (CUDA compiles)


def check_loopback_listen(listen: str) -> str:
    """`HOST:PORT` with a loopback IP literal (127.0.0.0/8, [::1]); "" = no TCP listener."""
    if listen == "":
        return listen
    host, _, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        loopback = ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if not loopback:
        fix = {"fix": 'use a loopback address like "127.0.0.1:8742" (or "" for none)'}
        message = (
            "is not a loopback address and port: the relay hands out the daemon's key, so it "
            "listens on 127.0.0.0/8 or [::1] only"
        )
        raise PydanticCustomError("relay_listen", message, fix)
    if not port.isdigit() or int(port) > 65535:
        fix = {"fix": 'give a port 0-65535, like "127.0.0.1:8742" (0: any free port)'}
        raise PydanticCustomError("relay_listen", "has no valid port", fix)
    return listen


RelayListen = Annotated[
    str,
    AfterValidator(check_loopback_listen),
    Field(json_schema_extra=_allowed('"127.0.0.1:PORT", "[::1]:PORT" or ""')),
]


class RelayLimits(BaseModel):
    """Per-user limits of the relay; absent = no limit."""

    model_config = _SECTION
    concurrent: Int | None = Field(None, ge=1)  # requests in flight at once
    per_minute: Int | None = Field(None, ge=1)  # requests started in any 60 s
    tokens_per_day: Int | None = Field(None, ge=1)  # tokens the provider reported, since 00:00 UTC


class RelaySection(BaseModel):
    """taogpud extension (issue 21): the AI tools' channel through the daemon (taogpud.relay)."""

    model_config = _SECTION
    enabled: bool = False  # the pass-through on the Unix socket (/relay/...) and on `listen`
    listen: RelayListen = "127.0.0.1:8742"  # the loopback TCP listener; "" = Unix socket only
    # where the daemon's key goes: "auto" = x-api-key on Anthropic-style paths (/v1/messages…),
    # `Authorization: Bearer` on every other
    key_header: Literal["auto", "authorization", "x-api-key"] = "auto"
    max_body_mb: Int = Field(32, ge=1, le=1024)  # a request body, images included
    limits: RelayLimits = RelayLimits()


class ServerSection(BaseModel):
    """taogpud extension: what every client of every listener (the control socket, the
    `.shm` socket, the relay's TCP port) is held to, so that none can starve the rest
    (taogpud/doors). Read at each new connection: a reload applies."""

    model_config = _SECTION
    max_connections: Int = Field(2048, ge=1)  # in all; also kept to half the open-file limit
    max_connections_per_uid: Int = Field(256, ge=1)
    # peers with no uid (a TCP client before its relay token is read) share this many
    max_connections_without_uid: Int = Field(64, ge=1)
    head_timeout_s: Number = Field(10, gt=0)  # a request head not complete by then: closed
    body_timeout_s: Number = Field(60, gt=0)  # a request body not whole by then: closed


class ReloadSection(BaseModel):
    """taogpud extension: how a save the watcher sees is applied (daemon/reload.py)."""

    model_config = _SECTION
    # A save is applied once both files have been still this long. Longer than an editor's
    # two-step save (an in-place write in two parts about a second apart, whose first part
    # can be valid on its own), short enough that a save is live in seconds. SIGHUP and
    # `taogpuctl config reload` do not wait.
    quiet_s: Number = Field(2.0, ge=0, le=8)


class ConfigFile(_LayeredSettings):
    """config.toml, snake_case as in the file."""

    model_config = SettingsConfigDict(env_prefix="TAOGPUD_CONFIG__")
    runtime: RuntimeSection = RuntimeSection()
    backend: BackendSection = BackendSection()
    memory: MemorySection = MemorySection()
    api: ApiSection = ApiSection()
    scheduling: SchedulingSection = SchedulingSection()
    ray: RaySection = RaySection()
    relay: RelaySection = RelaySection()
    server: ServerSection = ServerSection()
    reload: ReloadSection = ReloadSection()


# ---- the snapshot -------------------------------------------------------------------------


@dataclass(frozen=True)
class ConfigSnapshot:
    """One validated pair of files, passed everywhere; a reload builds a new one."""

    settings: SettingsFile
    config: ConfigFile
    settings_path: Path | None  # None = embedded defaults
    config_path: Path | None
    api_key: SecretStr | None
    key_source: KeySource
    warnings: tuple[Problem, ...]
    digest: str  # first 16 hex of sha256 over the redacted settings and config

    @property
    def backend(self) -> str:
        return self.settings.gpu.backend

    def cuda_device_ids(self) -> list[int] | Literal["all"]:
        ids = self.config.backend.cuda.device_id
        if ids == "all":
            return "all"
        return [ids] if isinstance(ids, int) else list(ids)

    def opencl_device_ids(self) -> list[int] | Literal["all"]:
        ids = self.config.backend.opencl.device_index
        if ids == "all":
            return "all"
        return [ids] if isinstance(ids, int) else list(ids)

    def redacted(self) -> dict[str, Any]:
        """The effective config as the user's files spell it, with the API key hidden, and
        with it anything shaped like a key or a URL's userinfo (shown.py) in any field."""
        paths = {"settings": self.settings_path, "config": self.config_path}
        return {
            **hide_tree(self._files(), self._known_secrets()),
            "paths": {name: None if path is None else str(path) for name, path in paths.items()},
            "key_source": self.key_source,
        }

    def _files(self) -> dict[str, Any]:
        """Both files' values, only the apiKey field hidden (what diff() compares)."""
        return {
            "settings": redacted_settings(self.settings),
            "config": self.config.model_dump(mode="json"),
        }

    def _known_secrets(self) -> tuple[str, ...]:
        return (self.api_key.get_secret_value(),) if self.api_key is not None else ()

    def secrets(self) -> tuple[str, ...]:
        """For the log's scrubber: the key, and every key-shaped token and URL userinfo in
        the files' values (a key typed into the wrong field is kept out of every line)."""
        return (*self._known_secrets(), *shaped_in(self._files()))

    def show(self, value: Any) -> Any:
        """`value` (of this config) as it may be shown: hidden as redacted() hides it."""
        return hide_tree(value, self._known_secrets())


def redacted_settings(settings: SettingsFile) -> dict[str, Any]:
    view: dict[str, Any] = _camel_keys(settings.model_dump(mode="json"))
    view["provider"]["apiKey"] = REDACTED if settings.provider.api_key.get_secret_value() else ""
    return view


def _camel_keys(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {to_camel(key): _camel_keys(value) for key, value in tree.items()}
    return tree


def config_digest(settings: SettingsFile, config: ConfigFile) -> str:
    # content only: the same files at another path, or a rotated key, keep their digest
    view = {"settings": redacted_settings(settings), "config": config.model_dump(mode="json")}
    encoded = json.dumps(view, sort_keys=True, separators=(",", ":")).encode()
    return hashlib.sha256(encoded).hexdigest()[:16]


# ---- paths and load -----------------------------------------------------------------------


def _prepare_settings(data: dict[str, Any], environ: Mapping[str, str]) -> dict[str, Any]:
    """${VAR} expansion in every string. An absent apiKey is the seed's reference, expanded
    too, so that no file and the seed file give the same snapshot."""
    expanded: dict[str, Any] = expand(data, environ)
    provider = expanded.setdefault("provider", {})
    if isinstance(provider, dict):
        provider.setdefault("api_key", expand(DEFAULT_API_KEY_REF, environ))
    return expanded


SETTINGS_KIND = FileKind(
    "settings.json",
    SettingsFile,
    "json",
    to_camel,
    "--settings or TAOGPUD_SETTINGS",
    _prepare_settings,
)
CONFIG_KIND = FileKind(
    "config.toml", ConfigFile, "toml", str, "--config, TAOGPUD_CONFIG or OPENCLAW_CONFIG"
)


def resolve_paths(
    settings: Path | None,
    config: Path | None,
    *,
    environ: Mapping[str, str],
    system: bool | None = None,
) -> tuple[Path | None, Path | None, bool, bool]:
    """(settings_path, config_path, settings_explicit, config_explicit).

    Explicit argument, else env (TAOGPUD_SETTINGS; TAOGPUD_CONFIG, then OPENCLAW_CONFIG), else
    the default directory (default_config_dir). A default file that does not exist resolves
    to None (embedded defaults); explicit paths come back as given, for load() to report if
    unusable. `system` (root: /etc/taogpud) follows the euid unless the caller says.
    """
    system_mode = not user_mode() if system is None else system
    directory = default_config_dir(environ, system=system_mode)
    settings_names, config_names = ("TAOGPUD_SETTINGS",), ("TAOGPUD_CONFIG", "OPENCLAW_CONFIG")
    settings_path, settings_explicit = pick_path(
        settings, environ, settings_names, directory / "settings.json"
    )
    config_path, config_explicit = pick_path(
        config, environ, config_names, directory / "config.toml"
    )
    return settings_path, config_path, settings_explicit, config_explicit


def load(
    settings_path: Path | None = None,
    config_path: Path | None = None,
    *,
    environ: Mapping[str, str] | None = None,
    previous: ConfigSnapshot | None = None,
) -> ConfigSnapshot:
    """Read, validate and cross-check both files; raise ConfigError listing every error.
    `previous` (a reload: the snapshot in force) lets a mismatch name the file that changed."""
    env = os.environ if environ is None else environ
    settings_at, config_at, _, _ = resolve_paths(settings_path, config_path, environ=env)
    problems: list[Problem] = []
    settings_layer = read_layer(SETTINGS_KIND, settings_at, env, problems)
    config_layer = read_layer(CONFIG_KIND, config_at, env, problems)
    settings, config = settings_layer.model, config_layer.model
    key: tuple[SecretStr | None, KeySource] = (None, "none")
    if settings is not None and config is not None:
        before = previous.settings.gpu.backend if previous is not None else None
        problems += blame_the_change(check_pair(settings, config), settings, config, before)
        problems += key_problems(settings_layer)
        key = resolve_api_key(settings, settings_layer, config, environ=env, problems=problems)
    key_env = config.api.api_key_env if config is not None else ApiSection().api_key_env
    problems = scrub(problems, [env.get(key_env, ""), key[0]], settings_layer)
    problems = name_files(problems, {"settings.json": settings_at, "config.toml": config_at})
    errors = [problem for problem in problems if problem.severity == "error"]
    if errors or settings is None or config is None:
        raise ConfigError(errors)
    warnings = tuple(problem for problem in problems if problem.severity != "error")
    digest = config_digest(settings, config)
    return ConfigSnapshot(settings, config, settings_at, config_at, *key, warnings, digest)


def name_files(problems: list[Problem], paths: Mapping[str, Path | None]) -> list[Problem]:
    """Every problem names its file by the path that was read, as syntax errors do; a label
    ("settings.json") stays only where the embedded defaults were used (no file)."""
    return [
        replace(problem, file=str(paths[problem.file]))
        if paths.get(problem.file) is not None
        else problem
        for problem in problems
    ]


# ---- reload -------------------------------------------------------------------------------


def diff(old: ConfigSnapshot, new: ConfigSnapshot) -> list[tuple[str, Any, Any]]:
    """("config.toml: scheduling.max_concurrent_tasks", 8, 3) per changed key, secrets hidden.

    A changed apiKey shows as ("settings.json: provider.apiKey", "<redacted>", "<redacted>");
    beyond the files' keys, ("key_source", old, new) and ("api_key", …) for the resolved key.
    """
    changes: list[tuple[str, Any, Any]] = []
    for part, label in (("settings", "settings.json"), ("config", "config.toml")):
        before, after = _flatten(old._files()[part]), _flatten(new._files()[part])
        for key in sorted(before.keys() | after.keys()):
            if before.get(key) != after.get(key):
                shown = (old.show(before.get(key)), new.show(after.get(key)))
                changes.append((f"{label}: {new.show(key)}", *shown))
    return changes + _secret_changes(old, new, {key for key, _, _ in changes})


def _secret_changes(
    old: ConfigSnapshot, new: ConfigSnapshot, reported: set[str]
) -> list[tuple[str, Any, Any]]:
    # "<redacted>" → "<redacted>" hides the value but still tells the operator it changed
    changes: list[tuple[str, Any, Any]] = []
    file_key = "settings.json: provider.apiKey"
    if old.settings.provider.api_key != new.settings.provider.api_key and file_key not in reported:
        changes.append((file_key, REDACTED, REDACTED))
    if old.key_source != new.key_source:
        changes.append(("key_source", old.key_source, new.key_source))
    if old.api_key != new.api_key:
        changes.append(("api_key", _hidden(old.api_key), _hidden(new.api_key)))
    return changes


def _hidden(secret: SecretStr | None) -> str | None:
    return None if secret is None else REDACTED


def _flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def needs_restart(changes: list[tuple[str, Any, Any]]) -> bool:
    """Whether any change touches a key in RESTART_KEYS (the workers must be rolled)."""
    keys = [key.split(": ", 1)[-1] for key, _, _ in changes]
    # a table's keys come flattened ("ray.worker_resources.taogpu"): match the table too
    return any(key in RESTART_KEYS or key.rsplit(".", 1)[0] in RESTART_KEYS for key in keys)
