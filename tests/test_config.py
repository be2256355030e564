"""The config loader: both files → one snapshot, or a ConfigError that lists every problem.

Real files in tmp_path, an explicit environ per test (HOME and systemd's
CONFIGURATION_DIRECTORY point into tmp_path, so neither ~/.config nor /etc is read), no mocks.
API keys are made up at run time and never written to fixtures.
"""

from __future__ import annotations

import json
import os
import secrets
import string
import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from taogpud.config import (
    RESTART_KEYS,
    ConfigFile,
    ConfigSnapshot,
    SettingsFile,
    diff,
    load,
    needs_restart,
    resolve_paths,
)
from taogpud.config.loading import default_config_dir
from taogpud.config.problem import Problem
from taogpud.errors import ConfigError

EXAMPLES = Path(__file__).parent.parent / "packaging" / "examples"
SEED, CPU = EXAMPLES / "gpu", EXAMPLES / "cpu"


class Files:
    """A temp directory to write a pair of files into and load them with a given env."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.config_dir = root / "etc"  # the default directory, whatever the euid
        self.environ = {"HOME": str(root / "home"), "CONFIGURATION_DIRECTORY": str(self.config_dir)}

    def write(self, name: str, content: str | bytes | dict[str, Any]) -> Path:
        path = self.root / name
        if isinstance(content, dict):
            content = json.dumps(content)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return path

    def load(
        self,
        settings: str | dict[str, Any] | None = None,
        config: str | None = None,
        **env: str,
    ) -> ConfigSnapshot:
        settings_path = None if settings is None else self.write("settings.json", settings)
        config_path = None if config is None else self.write("config.toml", config)
        return load(settings_path, config_path, environ={**self.environ, **env})

    def problems(
        self,
        settings: str | dict[str, Any] | None = None,
        config: str | None = None,
        **env: str,
    ) -> list[Problem]:
        with pytest.raises(ConfigError) as caught:
            self.load(settings, config, **env)
        return caught.value.problems


@pytest.fixture
def files(tmp_path: Path) -> Files:
    return Files(tmp_path)


def seed_settings(**sections: dict[str, Any]) -> dict[str, Any]:
    """The seed settings.json with some keys of some sections changed."""
    document: dict[str, Any] = json.loads((SEED / "settings.json").read_text())
    for name, changes in sections.items():
        document[name] = {**document.get(name, {}), **changes}
    return document


def seed_config(*replacements: tuple[str, str]) -> str:
    """The seed config.toml with whole lines replaced ("old line start", "new line")."""
    lines = (SEED / "config.toml").read_text().splitlines()
    for start, new in replacements:
        index = next(i for i, line in enumerate(lines) if line.startswith(start))
        lines[index] = new
    return "\n".join(lines) + "\n"


def only(problems: list[Problem], key: str) -> Problem:
    found = [problem for problem in problems if problem.key == key]
    assert len(found) == 1, problems
    return found[0]


def flatten(tree: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[prefix + key] = value
    return flat


def make_key() -> str:
    return "sk-test-" + secrets.token_hex(16)


# ---- the seed and the defaults ------------------------------------------------------------


def test_seed_pair_loads_and_equals_embedded_defaults(files: Files) -> None:
    """The setup guide's two files load unchanged and give exactly the embedded defaults."""
    seeded = load(SEED / "settings.json", SEED / "config.toml", environ=files.environ)
    defaults = files.load()
    assert seeded.settings == defaults.settings
    assert seeded.config == defaults.config
    assert seeded.digest == defaults.digest
    assert seeded.warnings == ()
    assert seeded.redacted()["settings"] == defaults.redacted()["settings"]


def test_seed_values_are_the_model_defaults(files: Files) -> None:
    """Every key of the seed pair is a field whose default is the seed's value."""
    effective = files.load().redacted()
    seed = {
        "settings": json.loads((SEED / "settings.json").read_text()),
        "config": tomllib.loads((SEED / "config.toml").read_text()),
    }
    for part in ("settings", "config"):
        for key, value in flatten(seed[part]).items():
            if key != "provider.apiKey":  # its default is the reference, expanded like a file's
                assert flatten(effective[part])[key] == value, key
    assert SettingsFile().provider.api_key.get_secret_value() == "${TAOTOKEN_API_KEY}"
    extensions = set(flatten(effective["config"])) - set(flatten(seed["config"]))
    assert extensions == {
        "runtime.cpu_devices",
        "backend.cuda.allow_user_kernels",
        "backend.opencl.device_index",
        "scheduling.queue_limit",
        "memory.upload_quota_mb",  # issue 17: each user's pending uploads
        "memory.array_budget_mb",  # issue 34: all uploads together, in progress included
        "reload.quiet_s",  # issue 34: a save applied once the files are quiet
        "scheduling.drain_timeout_s",
        "scheduling.job_timeout_s",
        "scheduling.executor",  # issue 10: the executor and its [ray] table
        "scheduling.program_log_kb",  # issue 37: a detached program's log
        "ray.address",
        "ray.namespace",
        "ray.worker_num_gpus",
        "ray.worker_num_cpus",
        "ray.local_num_gpus",
        "ray.local_num_cpus",
        "ray.connect_timeout_s",
        "ray.ready_timeout_s",
        "relay.enabled",  # issue 21: the AI tools' channel through the daemon
        "relay.listen",
        "relay.key_header",
        "relay.max_body_mb",
        "relay.limits.concurrent",
        "relay.limits.per_minute",
        "relay.limits.tokens_per_day",
        "server.max_connections",  # issue 17: what each client of the socket is held to
        "server.max_connections_per_uid",
        "server.head_timeout_s",
        "server.max_connections_without_uid",  # issue 34: every door, the same rules
        "server.body_timeout_s",
    }


def test_cpu_pair_loads(files: Files) -> None:
    """The CPU variant of the seed (backend cpu, device_type cpu, cuda off) is consistent."""
    snapshot = load(CPU / "settings.json", CPU / "config.toml", environ=files.environ)
    assert snapshot.backend == "cpu"
    assert snapshot.config.runtime.device_type == "cpu"
    assert snapshot.config.backend.cuda.enabled is False


def test_missing_default_files_mean_embedded_defaults(files: Files) -> None:
    """With no file at the default paths the snapshot is the defaults, with no paths."""
    snapshot = files.load()
    assert snapshot.settings_path is None and snapshot.config_path is None
    assert snapshot.redacted()["paths"] == {"settings": None, "config": None}
    # the seed's "${TAOTOKEN_API_KEY}" default is expanded like a file's: unset → ""
    assert snapshot.settings == SettingsFile(provider={"api_key": ""})
    assert snapshot.config == ConfigFile()


def test_models_and_snapshot_are_frozen(files: Files) -> None:
    """Neither the snapshot nor its models can be changed after load."""
    snapshot = files.load()
    with pytest.raises(ValidationError):
        snapshot.config.scheduling.max_concurrent_tasks = 3  # type: ignore[misc]
    with pytest.raises(ValidationError):
        snapshot.settings.gpu = snapshot.settings.gpu  # type: ignore[misc]
    with pytest.raises(AttributeError):
        snapshot.digest = "x"  # type: ignore[misc]


def test_partial_files_take_defaults_for_the_rest(files: Files) -> None:
    """A file with one key keeps every other key at its default."""
    snapshot = files.load({"gpu": {"memoryFraction": 0.5}}, "[scheduling]\nqueue_limit = 10\n")
    assert snapshot.settings.gpu.memory_fraction == 0.5
    assert snapshot.settings.gpu.backend == "cuda"
    assert snapshot.config.scheduling.queue_limit == 10
    assert snapshot.config.scheduling.max_concurrent_tasks == 8


def test_cuda_device_ids_are_normalised(files: Files) -> None:
    """device_id 1, [0, 2] and "all" come back as [1], [0, 2] and "all"."""
    one = files.load({"gpu": {"deviceId": 1}}, "[backend.cuda]\ndevice_id = 1\n")
    assert one.cuda_device_ids() == [1]
    two = files.load(None, "[backend.cuda]\ndevice_id = [0, 2]\n")
    assert two.cuda_device_ids() == [0, 2]
    every = files.load({"gpu": {"deviceId": 5}}, '[backend.cuda]\ndevice_id = "all"\n')
    assert every.cuda_device_ids() == "all"


def test_redacted_spells_keys_as_the_files_do(files: Files) -> None:
    """redacted() has camelCase settings, snake_case config, paths and the key source."""
    view = files.load(seed_settings(), (SEED / "config.toml").read_text()).redacted()
    assert view["settings"]["gpu"]["allowFallbackToCpu"] is False
    assert view["settings"]["provider"]["apiKey"] == ""
    assert view["config"]["scheduling"]["max_concurrent_tasks"] == 8
    assert view["paths"]["settings"] == str(files.root / "settings.json")
    assert view["key_source"] == "none"
    json.dumps(view)  # it is plain JSON


def test_digest_follows_content_not_path(files: Files) -> None:
    """The digest is 16 hex digits, equal for equal content and different after a change."""
    first = files.load(None, "[scheduling]\nqueue_limit = 10\n")
    again = files.load(None, "[scheduling]\nqueue_limit = 10\n")
    changed = files.load(None, "[scheduling]\nqueue_limit = 11\n")
    assert len(first.digest) == 16 and set(first.digest) <= set(string.hexdigits)
    assert first.digest == again.digest != changed.digest


# ---- file problems ------------------------------------------------------------------------


def test_explicit_missing_file_is_an_error(files: Files) -> None:
    """An explicit path that does not exist is an error naming the path."""
    missing = files.root / "nope.json"
    with pytest.raises(ConfigError) as caught:
        load(missing, None, environ=files.environ)
    problem = caught.value.problems[0]
    assert problem.file == str(missing)
    assert "does not exist" in problem.message


def test_directory_empty_and_binary_files_are_errors(files: Files) -> None:
    """A directory, an empty file and a non-UTF-8 file are each reported, all at once."""
    (files.root / "dir.json").mkdir()
    empty = files.write("config.toml", "  \n")
    with pytest.raises(ConfigError) as caught:
        load(files.root / "dir.json", empty, environ=files.environ)
    messages = [problem.message for problem in caught.value.problems]
    assert messages == ["is a directory, not a file", "is empty"]
    binary = files.write("bad.toml", b"[runtime]\nthread_num = 4\n\xff\xfe\n")
    with pytest.raises(ConfigError) as caught:
        load(None, binary, environ=files.environ)
    assert caught.value.problems[0].key == "line 3"


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their mode")
def test_unreadable_file_is_an_error(files: Files) -> None:
    """A file the daemon cannot read is an error that says so."""
    path = files.write("settings.json", "{}")
    path.chmod(0)
    with pytest.raises(ConfigError) as caught:
        load(path, None, environ=files.environ)
    assert "permission denied" in caught.value.problems[0].message


def test_dangling_symlink_at_default_path_is_an_error(files: Files) -> None:
    """A default path that is a broken symlink is reported, not taken for "no file"."""
    files.config_dir.mkdir()
    (files.config_dir / "config.toml").symlink_to(files.root / "gone.toml")
    with pytest.raises(ConfigError) as caught:
        load(environ=files.environ)
    assert caught.value.problems[0].message == "does not exist"


def test_json_parse_error_has_line_and_column(files: Files) -> None:
    """A JSON syntax error names the file, its line and column, and what to fix."""
    problems = files.problems('{\n  "gpu": {"deviceId": 0,}\n}\n')
    assert problems[0].file == str(files.root / "settings.json")
    assert problems[0].key == "line 2, column 25"
    assert problems[0].message.startswith("invalid JSON")
    assert "trailing" in problems[0].fix or "none after the last" in problems[0].fix


@pytest.mark.parametrize(
    "cut", ['{\n  "provider": {"baseUrl": "https://taotok', '{\n  "gpu": {"deviceId": 0'], ids=str
)
def test_a_truncated_settings_json_says_it_ends_early(files: Files, cut: str) -> None:
    """A settings.json cut short (a copy interrupted, a full disk) says so in a whole sentence:
    where the string it cut began, and that the file ends there. (json's own words ended in a
    dangling "Unterminated string starting at".)"""
    problem = files.problems(cut)[0]
    assert not problem.message.rstrip().endswith(("at", ":")), problem.message
    assert "the file ends" in problem.message and "cut short" in problem.message
    if '"https' in cut:
        assert "unterminated string" in problem.message and problem.key == "line 2, column 27"


def test_toml_parse_error_has_line_and_column(files: Files) -> None:
    """A TOML syntax error names the file, its line and column."""
    problems = files.problems(None, "[runtime]\nthread_num = 4\ndevice_type = gpu\n")
    assert problems[0].key == "line 3, column 15"
    assert problems[0].message.startswith("invalid TOML: Invalid value")


def test_json_top_level_must_be_an_object(files: Files) -> None:
    """A settings.json that is a list is an error, not a crash."""
    assert "must be a JSON object" in files.problems("[1, 2]")[0].message


def test_json_key_given_twice_is_an_error(files: Files) -> None:
    """A key repeated in one JSON object is reported (json would keep the last silently)."""
    problem = only(files.problems('{"gpu": {"deviceId": 0, "deviceId": 0}}'), "gpu.deviceId")
    assert problem.message == "is given twice"


def test_deeply_nested_document_is_an_error(files: Files) -> None:
    """A document nested far too deep is reported instead of overflowing the stack."""
    problems = files.problems('{"models": ' + "[" * 100_000 + "]" * 100_000 + "}")
    assert problems[0].file == str(files.root / "settings.json")


# ---- keys and values ----------------------------------------------------------------------


def test_unknown_key_did_you_mean_in_settings_camel_case(files: Files) -> None:
    """A misspelt settings key gets a did-you-mean in the file's camelCase."""
    problem = only(files.problems({"gpu": {"memoryFracton": 0.5}}), "gpu.memoryFracton")
    assert str(problem) == (
        f"{files.root / 'settings.json'}: gpu.memoryFracton: unknown key "
        '(fix: did you mean "memoryFraction"?)'
    )


def test_snake_case_in_settings_suggests_camel_case(files: Files) -> None:
    """memory_fraction in settings.json is unknown and points at memoryFraction."""
    problem = only(files.problems({"gpu": {"memory_fraction": 0.5}}), "gpu.memory_fraction")
    assert problem.fix == 'did you mean "memoryFraction"?'


def test_unknown_key_did_you_mean_in_config(files: Files) -> None:
    """Unknown tables and keys in config.toml are errors with did-you-mean, all listed."""
    problems = files.problems(None, "[runtim]\n[scheduling]\nmax_concurent_tasks = 3\n")
    assert only(problems, "runtim").fix == 'did you mean "runtime"?'
    assert only(problems, "scheduling.max_concurent_tasks").fix == (
        'did you mean "max_concurrent_tasks"?'
    )


def test_unknown_key_without_a_close_match_lists_valid_keys(files: Files) -> None:
    """With nothing close, the fix lists the keys valid at that level."""
    problem = only(files.problems(None, "[memory]\nzzz = 1\n"), "memory.zzz")
    assert (
        problem.fix
        == "remove it; valid here: pool_size_mb, auto_grow, array_budget_mb, upload_quota_mb"
    )


def test_out_of_range_says_given_allowed_and_fix(files: Files) -> None:
    """A value out of range says what was given, what is allowed and the fix."""
    problem = only(files.problems({"gpu": {"memoryFraction": 1.5}}), "gpu.memoryFraction")
    assert problem.message == "got 1.5, expected a number above 0 and at most 1"
    assert problem.fix == (
        "set gpu.memoryFraction to a number above 0 and at most 1; the default is 0.85"
    )


def test_every_error_is_listed_not_only_the_first(files: Files) -> None:
    """Errors in both files come back together in one ConfigError."""
    problems = files.problems(
        {"provider": {"maxRetries": 21, "timeoutMs": 0}, "gpu": {"backend": "rocm"}},
        '[backend.cuda]\nstream_count = 0\ncuda_arch = "sm89"\n[scheduling]\nstrategy = "x"\n',
    )
    keys = {problem.key for problem in problems}
    assert keys == {
        "provider.maxRetries",
        "provider.timeoutMs",
        "gpu.backend",
        "backend.cuda.stream_count",
        "backend.cuda.cuda_arch",
        "scheduling.strategy",
    }
    assert only(problems, "gpu.backend").message == (
        'got "rocm", expected one of "cuda", "cpu", "opencl"'
    )


def test_booleans_are_not_numbers(files: Files) -> None:
    """deviceId: true is an error, not device 1."""
    problem = only(files.problems({"gpu": {"deviceId": True}}), "gpu.deviceId")
    assert problem.message.startswith("got true, expected")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("[]", 'got [], expected an index (0 or more), a list of distinct indices, or "all"'),
        ("[0, -1]", "got [0, -1], expected an index"),
        ("[1, 1]", "got [1, 1]: lists a device more than once"),
        ('"ALL"', 'got "ALL", expected an index'),
    ],
)
def test_device_id_forms(files: Files, value: str, message: str) -> None:
    """device_id must be an index, a non-empty list of distinct indices, or "all"."""
    problems = files.problems(None, f"[backend.cuda]\ndevice_id = {value}\n")
    assert only(problems, "backend.cuda.device_id").message.startswith(message)


def test_log_level_accepts_any_case_and_warn(files: Files) -> None:
    """logging.level "WARN" reads as "warning", "Debug" as "debug"."""
    assert files.load({"logging": {"level": "WARN"}}).settings.logging.level == "warning"
    assert files.load({"logging": {"level": "Debug"}}).settings.logging.level == "debug"
    assert only(files.problems({"logging": {"level": "loud"}}), "logging.level")


def test_job_timeout_is_optional_and_positive(files: Files) -> None:
    """job_timeout_s may be absent (no timeout) or a positive number, not zero."""
    assert (
        files.load(None, "[scheduling]\njob_timeout_s = 2.5\n").config.scheduling.job_timeout_s
        == 2.5
    )
    problem = only(
        files.problems(None, "[scheduling]\njob_timeout_s = 0\n"), "scheduling.job_timeout_s"
    )
    assert "above 0" in problem.message


def test_nan_is_rejected(files: Files) -> None:
    """NaN (which Python's json accepts) is no valid memoryFraction."""
    problems = files.problems('{"gpu": {"memoryFraction": NaN}}')
    assert only(problems, "gpu.memoryFraction")


def test_cuda_arch_forms(files: Files) -> None:
    """cuda_arch accepts "auto" and sm_NN[N][a-z], nothing else."""
    for arch in ("auto", "sm_89", "sm_100", "sm_90a"):
        loaded = files.load(None, f'[backend.cuda]\ncuda_arch = "{arch}"\n')
        assert loaded.config.backend.cuda.cuda_arch == arch
    assert only(
        files.problems(None, '[backend.cuda]\ncuda_arch = "89"\n'), "backend.cuda.cuda_arch"
    )


def test_section_of_the_wrong_type(files: Files) -> None:
    """A section given as a number says which keys the section holds."""
    problem = only(files.problems({"gpu": 3}), "gpu")
    assert problem.message.startswith("got a number, expected a section of keys backend, deviceId")
    key = make_key()
    problem = only(files.problems({"provider": [key]}), "provider")
    assert key not in str(problem) and problem.message.startswith("got a list")


# ---- ${VAR} -------------------------------------------------------------------------------


def test_var_references_expand_in_json_strings(files: Files) -> None:
    """${VAR} and ${VAR:-default} expand in settings.json before validation."""
    snapshot = files.load(
        {
            "models": {"default": "${MODEL}", "coding": "${UNSET:-claude-haiku}"},
            "gpu": {"deviceId": "${GPU:-0}"},
        },
        "[backend.cuda]\ndevice_id = [0, 3]\n",
        MODEL="claude-x",
        GPU="3",
    )
    assert snapshot.settings.models.default == "claude-x"
    assert snapshot.settings.models.coding == "claude-haiku"
    assert snapshot.settings.gpu.device_id == 3


def test_unset_var_without_default_is_empty(files: Files) -> None:
    """An unset ${VAR} becomes "" (shell rules), which a non-empty field then rejects."""
    problem = only(files.problems({"models": {"default": "${NOPE}"}}), "models.default")
    assert problem.message == 'got "", expected a non-empty string'


def test_empty_var_takes_the_default(files: Files) -> None:
    """${VAR:-d} uses d when VAR is set but empty, as the shell does."""
    snapshot = files.load({"models": {"default": "${EMPTY:-claude-y}"}}, None, EMPTY="")
    assert snapshot.settings.models.default == "claude-y"


# ---- env overrides ------------------------------------------------------------------------


def test_env_overrides_win_over_files(files: Files) -> None:
    """TAOGPUD_CONFIG__… and TAOGPUD_SETTINGS__… override keys of the files."""
    snapshot = files.load(
        seed_settings(),
        (SEED / "config.toml").read_text(),
        TAOGPUD_CONFIG__SCHEDULING__MAX_CONCURRENT_TASKS="3",
        TAOGPUD_SETTINGS__GPU__MEMORY_FRACTION="0.5",
    )
    assert snapshot.config.scheduling.max_concurrent_tasks == 3
    assert snapshot.settings.gpu.memory_fraction == 0.5
    assert snapshot.config.scheduling.strategy == "round_robin"  # its sibling is kept


def test_env_override_of_a_device_list_and_a_section(files: Files) -> None:
    """A JSON list and a whole section in JSON override as expected."""
    snapshot = files.load(
        {"gpu": {"deviceId": 1}},
        None,
        TAOGPUD_CONFIG__BACKEND__CUDA__DEVICE_ID="[0, 1]",
        TAOGPUD_CONFIG__MEMORY='{"auto_grow": false}',
    )
    assert snapshot.cuda_device_ids() == [0, 1]
    assert snapshot.config.memory.auto_grow is False
    assert snapshot.config.memory.pool_size_mb == 4096


def test_path_variables_are_not_overrides(files: Files) -> None:
    """TAOGPUD_SETTINGS and TAOGPUD_CONFIG name files; they are not taken as overrides."""
    settings = files.write("s.json", {"gpu": {"memoryFraction": 0.25}})
    config = files.write("c.toml", "[scheduling]\nqueue_limit = 7\n")
    snapshot = load(
        environ={**files.environ, "TAOGPUD_SETTINGS": str(settings), "TAOGPUD_CONFIG": str(config)}
    )
    assert snapshot.settings.gpu.memory_fraction == 0.25
    assert snapshot.config.scheduling.queue_limit == 7


def test_invalid_override_names_the_env_var(files: Files) -> None:
    """A bad override value is reported against the variable that set it."""
    problems = files.problems(None, None, TAOGPUD_CONFIG__SCHEDULING__MAX_CONCURRENT_TASKS="x")
    problem = only(problems, "scheduling.max_concurrent_tasks")
    var = "TAOGPUD_CONFIG__SCHEDULING__MAX_CONCURRENT_TASKS"
    assert problem.message == f'{var} gives "x", expected an integer of 1 or more'
    assert problem.fix == "correct or unset TAOGPUD_CONFIG__SCHEDULING__MAX_CONCURRENT_TASKS"


def test_misspelt_override_gets_the_right_name(files: Files) -> None:
    """An override naming no key is an error whose fix spells the variable right."""
    problems = files.problems(
        None,
        None,
        TAOGPUD_SETTINGS__GPU__MEMORY_FRACTON="0.5",
        TAOGPUD_CONFIG__SCHEDULNG__QUEUE_LIMIT="5",
    )
    assert only(problems, "gpu.memoryFracton").fix == (
        "did you mean TAOGPUD_SETTINGS__GPU__MEMORY_FRACTION?"
    )
    assert (
        only(problems, "schedulng").fix == "did you mean TAOGPUD_CONFIG__SCHEDULING__QUEUE_LIMIT?"
    )


def test_override_section_must_be_a_json_object(files: Files) -> None:
    """A section override that is not a JSON object is named, its value is not shown."""
    problem = only(files.problems(None, None, TAOGPUD_SETTINGS__PROVIDER="oops"), "provider")
    assert problem.message == "TAOGPUD_SETTINGS__PROVIDER must hold a JSON object"


def test_unknown_key_inside_a_json_override(files: Files) -> None:
    """A misspelt key inside a section given as JSON is named with a did-you-mean."""
    problems = files.problems(None, None, TAOGPUD_CONFIG__MEMORY='{"auto_grw": false}')
    problem = only(problems, "memory.auto_grw")
    assert "TAOGPUD_CONFIG__MEMORY" in problem.message
    assert problem.fix == 'did you mean "auto_grow"?'


# ---- cross-file rules ---------------------------------------------------------------------


def test_base_urls_must_match(files: Files) -> None:
    """provider.baseUrl and api.base_url must be one URL; both are named."""
    problems = files.problems({"provider": {"baseUrl": "https://other.example/api"}})
    problem = only(problems, "provider.baseUrl")
    assert "api.base_url" in problem.message and "config.toml" in problem.message


def test_base_urls_match_despite_a_trailing_slash(files: Files) -> None:
    """A trailing slash on one side is not a difference."""
    assert files.load({"provider": {"baseUrl": "https://taotoken.net/api/"}})


def test_utm_parameters_are_an_error(files: Files) -> None:
    """A URL carrying utm_* parameters is an error in either file."""
    url = "https://taotoken.net/api?utm_source=guide&x=1"
    problems = files.problems({"provider": {"baseUrl": url}}, f'[api]\nbase_url = "{url}"\n')
    for key in ("provider.baseUrl", "api.base_url"):
        problem = only(problems, key)
        assert "utm_source" in problem.message
        assert problem.fix == "remove utm_source from it"


def test_base_url_must_be_http(files: Files) -> None:
    """A base URL that is no http(s) URL is an error."""
    assert only(files.problems(None, '[api]\nbase_url = "taotoken.net"\n'), "api.base_url")


def test_device_must_be_in_the_cuda_device_set(files: Files) -> None:
    """gpu.deviceId outside backend.cuda.device_id is an error naming both."""
    problems = files.problems({"gpu": {"deviceId": 2}}, "[backend.cuda]\ndevice_id = [0, 1]\n")
    problem = only(problems, "gpu.deviceId")
    assert problem.message == "device 2 is not in config.toml backend.cuda.device_id [0, 1]"
    assert problem.fix == "set gpu.deviceId to 0 or 1, or add 2 to backend.cuda.device_id"


def test_device_set_all_accepts_any_device(files: Files) -> None:
    """device_id = "all" accepts any gpu.deviceId."""
    assert files.load({"gpu": {"deviceId": 7}}, '[backend.cuda]\ndevice_id = "all"\n')


def test_cpu_backend_with_cuda_config_is_an_error(files: Files) -> None:
    """gpu.backend cpu with device_type gpu and cuda enabled names both and both fixes."""
    problem = only(files.problems({"gpu": {"backend": "cpu"}}), "gpu.backend")
    assert problem.message == (
        '"cpu" disagrees with config.toml runtime.device_type = "gpu", backend.cuda.enabled = true'
    )
    assert 'for cpu: gpu.backend = "cpu", runtime.device_type = "cpu"' in problem.fix
    assert 'for cuda: gpu.backend = "cuda", runtime.device_type = "gpu"' in problem.fix


def test_cuda_backend_with_cuda_disabled_is_an_error(files: Files) -> None:
    """gpu.backend cuda needs backend.cuda.enabled and device_type gpu."""
    config = seed_config(("enabled = true", "enabled = false"))
    problem = only(files.problems(None, config), "gpu.backend")
    assert problem.message == '"cuda" disagrees with config.toml backend.cuda.enabled = false'
    config = seed_config(("device_type", 'device_type = "cpu"'))
    assert "runtime.device_type" in only(files.problems(None, config), "gpu.backend").message


def test_opencl_backend_needs_opencl_enabled(files: Files) -> None:
    """gpu.backend opencl ⇔ backend.opencl.enabled, with cuda off; device_type gpu is fine."""
    config = "[backend.cuda]\nenabled = false\n[backend.opencl]\nenabled = true\n"
    assert files.load({"gpu": {"backend": "opencl"}}, config).backend == "opencl"
    problem = only(files.problems({"gpu": {"backend": "opencl"}}), "gpu.backend")
    assert "backend.opencl.enabled = false" in problem.message
    assert "for opencl:" in problem.fix
    enabled_for_cuda = only(
        files.problems(None, "[backend.opencl]\nenabled = true\n"), "gpu.backend"
    )
    assert "backend.opencl.enabled = true" in enabled_for_cuda.message


def test_timeouts_that_differ_are_a_warning(files: Files) -> None:
    """provider.timeoutMs / 1000 ≠ api.request_timeout_s loads, with a warning."""
    snapshot = files.load({"provider": {"timeoutMs": 30000}})
    (warning,) = snapshot.warnings
    assert warning.severity == "warning" and warning.key == "provider.timeoutMs"
    assert warning.fix == "set provider.timeoutMs to 60000 or api.request_timeout_s to 30"


# ---- the API key --------------------------------------------------------------------------


def test_key_from_credential_wins(files: Files) -> None:
    """The systemd credential beats the env var; its trailing newline is stripped."""
    key, other = make_key(), make_key()
    credentials = files.root / "creds"
    credentials.mkdir()
    (credentials / "taotoken_api_key").write_text(key + "\n")
    snapshot = files.load(
        None, None, CREDENTIALS_DIRECTORY=str(credentials), TAOTOKEN_API_KEY=other
    )
    assert snapshot.key_source == "credential"
    assert snapshot.api_key is not None and snapshot.api_key.get_secret_value() == key


def test_unreadable_credential_is_an_error(files: Files) -> None:
    """A credential path that cannot be read (here a directory) is an error naming it."""
    credentials = files.root / "creds"
    (credentials / "taotoken_api_key").mkdir(parents=True)
    problems = files.problems(None, None, CREDENTIALS_DIRECTORY=str(credentials))
    assert problems[0].file == str(credentials / "taotoken_api_key")
    assert problems[0].message.startswith("cannot be read")


def test_key_from_the_named_env_var(files: Files) -> None:
    """With no credential, the env var named by api.api_key_env supplies the key."""
    key = make_key()
    snapshot = files.load(None, '[api]\napi_key_env = "MY_KEY"\n', MY_KEY=key)
    assert snapshot.key_source == "env"
    assert snapshot.api_key is not None and snapshot.api_key.get_secret_value() == key


def test_key_through_a_reference_counts_as_env(files: Files) -> None:
    """apiKey "${OTHER}" expanding to a key reports source env, with no plaintext warning."""
    key = make_key()
    snapshot = files.load({"provider": {"apiKey": "${OTHER}"}}, None, OTHER=key)
    assert snapshot.key_source == "env"
    assert snapshot.warnings == ()


def test_literal_key_in_file_is_used_and_warned(files: Files) -> None:
    """A literal apiKey is source file, with a plaintext warning that does not show it."""
    key = make_key()
    snapshot = files.load({"provider": {"apiKey": key}})
    assert snapshot.key_source == "file"
    (warning,) = snapshot.warnings
    assert warning.key == "provider.apiKey" and key not in str(warning)
    assert "credential" in warning.fix and "TAOTOKEN_API_KEY" in warning.fix


def test_no_key_anywhere(files: Files) -> None:
    """No credential, no env var, no apiKey: no key, source none."""
    snapshot = files.load(seed_settings())
    assert snapshot.api_key is None and snapshot.key_source == "none"


def test_key_override_through_env_counts_as_env(files: Files) -> None:
    """TAOGPUD_SETTINGS__PROVIDER__API_KEY supplies the key as source env."""
    key = make_key()
    snapshot = files.load(None, None, TAOGPUD_SETTINGS__PROVIDER__API_KEY=key)
    assert snapshot.key_source == "env" and snapshot.warnings == ()


def test_the_key_never_appears_in_output(files: Files) -> None:
    """The key is absent from errors, problems, reprs, redacted(), diff() and warnings."""
    key = make_key()
    env = {"TAOTOKEN_API_KEY": key}
    broken = {
        "provider": {"apiKey": key, "timeoutMs": "${TAOTOKEN_API_KEY}", "maxRetries": [key]},
        "models": {"default": ""},
    }
    with pytest.raises(ConfigError) as caught:
        files.load(broken, None, **env, TAOGPUD_SETTINGS__PROVIDER__API_KEY=key)
    texts = [str(caught.value), repr(caught.value.problems)]
    texts += [json.dumps(problem.as_dict()) for problem in caught.value.problems]
    old = files.load(None, None, **env)
    new = files.load({"provider": {"apiKey": key}, "gpu": {"deviceId": 0}}, None)
    texts += [repr(old), repr(new), str(new.settings), json.dumps(new.redacted())]
    texts += [repr(diff(old, new)), repr(new.warnings), new.digest]
    for text in texts:
        assert key not in text
    assert any("<redacted>" in text for text in texts)


def test_wrong_type_for_the_key_does_not_echo_it(files: Files) -> None:
    """An apiKey of the wrong type is an error that does not show the value."""
    problem = only(
        files.problems({"provider": {"apiKey": ["secret-ish-value"]}}), "provider.apiKey"
    )
    assert "secret-ish-value" not in str(problem)
    assert problem.message == "the value (not shown) is invalid, expected a string"


def test_fixture_files_hold_no_key() -> None:
    """The fixture files reference the key by ${VAR} only."""
    for path in EXAMPLES.rglob("settings.json"):
        assert json.loads(path.read_text())["provider"]["apiKey"] == "${TAOTOKEN_API_KEY}"


# ---- diff and restart ---------------------------------------------------------------------


def test_diff_lists_changed_keys_by_file(files: Files) -> None:
    """diff() names each changed key as "file: key" with old and new values."""
    old = files.load()
    new = files.load({"logging": {"level": "debug"}}, "[scheduling]\nmax_concurrent_tasks = 3\n")
    assert diff(old, new) == [
        ("settings.json: logging.level", "info", "debug"),
        ("config.toml: scheduling.max_concurrent_tasks", 8, 3),
    ]
    assert diff(new, new) == []
    assert not needs_restart(diff(old, new))


def test_diff_redacts_a_changed_key(files: Files) -> None:
    """A rotated key shows as changed, with both values redacted."""
    old = files.load(None, None, TAOTOKEN_API_KEY=make_key())
    new = files.load(None, None, TAOTOKEN_API_KEY=make_key())
    changes = diff(old, new)
    assert ("settings.json: provider.apiKey", "<redacted>", "<redacted>") in changes
    assert ("api_key", "<redacted>", "<redacted>") in changes


def test_needs_restart_for_device_and_worker_keys(files: Files) -> None:
    """Device set, backend, streams, pool and threads changes need new workers."""
    old = files.load()
    new = files.load(None, "[backend.cuda]\ndevice_id = [0, 1]\nstream_count = 4\n")
    changes = diff(old, new)
    assert ("config.toml: backend.cuda.device_id", 0, [0, 1]) in changes
    assert needs_restart(changes)
    assert needs_restart([("settings.json: gpu.deviceId", 0, 1)])
    assert not needs_restart([("config.toml: scheduling.queue_limit", 1000, 10)])
    assert {"memory.pool_size_mb", "runtime.thread_num", "runtime.cpu_devices"} <= RESTART_KEYS


# ---- paths --------------------------------------------------------------------------------


def test_paths_explicit_argument_wins() -> None:
    """An explicit argument beats TAOGPUD_SETTINGS / TAOGPUD_CONFIG."""
    environ = {"TAOGPUD_SETTINGS": "/env/s.json", "TAOGPUD_CONFIG": "/env/c.toml"}
    resolved = resolve_paths(Path("a.json"), Path("b.toml"), environ=environ, system=False)
    assert resolved == (Path("a.json"), Path("b.toml"), True, True)


def test_paths_from_env_then_openclaw() -> None:
    """TAOGPUD_SETTINGS; TAOGPUD_CONFIG before OPENCLAW_CONFIG; both count as explicit."""
    environ = {
        "TAOGPUD_SETTINGS": "/env/s.json",
        "TAOGPUD_CONFIG": "/env/c.toml",
        "OPENCLAW_CONFIG": "/claw/c.toml",
    }
    assert resolve_paths(None, None, environ=environ, system=False) == (
        Path("/env/s.json"),
        Path("/env/c.toml"),
        True,
        True,
    )
    del environ["TAOGPUD_CONFIG"]
    assert resolve_paths(None, None, environ=environ, system=False)[1] == Path("/claw/c.toml")


def test_paths_default_to_xdg_config_home(files: Files) -> None:
    """In user mode the defaults live in $XDG_CONFIG_HOME/taogpud, else ~/.config/taogpud."""
    xdg = files.root / "xdg"
    (xdg / "taogpud").mkdir(parents=True)
    (xdg / "taogpud" / "config.toml").write_text("[scheduling]\nqueue_limit = 5\n")
    environ = {"HOME": str(files.root / "home"), "XDG_CONFIG_HOME": str(xdg)}
    resolved = resolve_paths(None, None, environ=environ, system=False)
    assert resolved == (None, xdg / "taogpud" / "config.toml", False, False)
    del environ["XDG_CONFIG_HOME"]
    assert default_config_dir(environ, system=False) == files.root / "home/.config/taogpud"


def test_paths_default_to_etc_for_root_and_systemd_dir(files: Files) -> None:
    """System mode uses /etc/taogpud; systemd's $CONFIGURATION_DIRECTORY comes first."""
    assert default_config_dir({}, system=True) == Path("/etc/taogpud")
    environ = {"CONFIGURATION_DIRECTORY": str(files.root)}
    assert default_config_dir(environ, system=True) == files.root


def test_load_reads_default_paths(files: Files) -> None:
    """load() with no paths reads the files at the default location."""
    files.config_dir.mkdir()
    (files.config_dir / "settings.json").write_text('{"gpu": {"memoryFraction": 0.3}}')
    snapshot = load(environ=files.environ)
    assert snapshot.settings_path == files.config_dir / "settings.json"
    assert snapshot.settings.gpu.memory_fraction == 0.3
    assert snapshot.config_path is None


# ---- nothing escapes ----------------------------------------------------------------------

KNOWN_KEYS = [
    "provider", "models", "gpu", "logging", "baseUrl", "apiKey", "timeoutMs", "maxRetries",
    "backend", "deviceId", "memoryFraction", "level", "runtime", "memory", "api", "scheduling",
    "cuda", "opencl", "device_id", "enabled", "stream_count", "base_url", "strategy",
]  # fmt: skip
TOML_VALUES = ["1", "-1", "0", "1.5", "nan", "inf", '"x"', '"all"', "true", "[0, 1]", "[]", "{}"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4)
        | st.dictionaries(st.sampled_from(KNOWN_KEYS) | st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=20,
)
toml_lines = st.lists(
    st.one_of(
        st.sampled_from([*KNOWN_KEYS, "backend.cuda", "backend.opencl"]).map(lambda k: f"[{k}]"),
        st.tuples(st.sampled_from(KNOWN_KEYS), st.sampled_from(TOML_VALUES)).map(" = ".join),
        st.text(max_size=20),
    ),
    max_size=8,
).map("\n".join)
SEED_KEYS = [(name, key) for name, section in seed_settings().items() for key in section]
SEED_LINES = [line.split(" = ")[0] for line in seed_config().splitlines() if " = " in line]


def _settings_with(change: tuple[tuple[str, str], Any]) -> str:
    (name, key), value = change
    return json.dumps(seed_settings(**{name: {key: value}}))


def _config_with(change: tuple[str, str]) -> str:
    key, value = change
    return seed_config((key + " ", f"{key} = {value}"))


anything = st.one_of(
    st.binary(max_size=60), json_values.map(json.dumps), st.text(max_size=60), toml_lines
)
# near-valid files (the seed with one value changed) reach validation and the cross-file rules
plausible = st.sampled_from([0, 1, 0.5, 60000, "cpu", "WARN", True, "https://taotoken.net/api/"])
near_settings = st.just(json.dumps(seed_settings())) | st.tuples(
    st.sampled_from(SEED_KEYS), plausible | json_values
).map(_settings_with)
near_config = st.just(seed_config()) | st.tuples(
    st.sampled_from(SEED_LINES), st.sampled_from(TOML_VALUES)
).map(_config_with)
settings_documents = st.booleans().flatmap(lambda near: near_settings if near else anything)
config_documents = st.booleans().flatmap(lambda near: near_config if near else anything)
overrides = st.dictionaries(
    st.sampled_from(
        [
            "TAOGPUD_SETTINGS__GPU__DEVICE_ID",
            "TAOGPUD_SETTINGS__PROVIDER",
            "TAOGPUD_CONFIG__BACKEND__CUDA__DEVICE_ID",
            "TAOGPUD_CONFIG__SCHEDULING",
            "TAOGPUD_CONFIG__X__Y",
            "TAOGPUD_CONFIG__",
        ]
    ),
    st.sampled_from(["0", "1", "[0, 1]", "all", "{}", '{"strategy": "least_loaded"}'])
    | st.text(max_size=12),
    max_size=2,
)


@settings(
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", "200")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(settings_doc=settings_documents, config_doc=config_documents, env=st.just({}) | overrides)
def test_any_input_gives_a_snapshot_or_a_config_error(
    tmp_path_factory: pytest.TempPathFactory,
    settings_doc: str | bytes,
    config_doc: str | bytes,
    env: Mapping[str, str],
) -> None:
    """Whatever the files and overrides hold, load() returns a snapshot or raises ConfigError."""
    root = tmp_path_factory.mktemp("fuzz")
    paths = []
    for name, document in (("settings.json", settings_doc), ("config.toml", config_doc)):
        data = document if isinstance(document, bytes) else document.encode("utf-8", "replace")
        (root / name).write_bytes(data)
        paths.append(root / name)
    try:
        snapshot = load(paths[0], paths[1], environ={"HOME": str(root), **env})
    except ConfigError as error:
        assert error.problems and all(isinstance(p, Problem) for p in error.problems)
        event("ConfigError")
    else:
        assert isinstance(snapshot, ConfigSnapshot)
        event("snapshot")
