"""[backend.opencl] in config.toml: its keys, and the rules that tie it to settings.json.

Real files in tmp_path and an explicit environ per test, as in test_config.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from taogpud.config import ConfigSnapshot, diff, load, needs_restart
from taogpud.config.problem import Problem
from taogpud.errors import ConfigError
from taogpud.testing import write_pair

OPENCL_CONFIG = """
[runtime]
device_type = "cpu"
[backend.cuda]
enabled = false
[backend.opencl]
enabled = true
platform_index = 0
device_index = {devices}
"""


def load_pair(root: Path, settings: dict[str, Any], config: str) -> ConfigSnapshot:
    environ = {"HOME": str(root / "home"), "CONFIGURATION_DIRECTORY": str(root / "etc")}
    return load(*write_pair(root, settings, config), environ=environ)


def problems_of(root: Path, settings: dict[str, Any], config: str) -> list[Problem]:
    with pytest.raises(ConfigError) as caught:
        load_pair(root, settings, config)
    return caught.value.problems


def only(problems: list[Problem], key: str) -> Problem:
    found = [problem for problem in problems if problem.key == key]
    assert len(found) == 1, problems
    return found[0]


def test_an_opencl_pair_loads_and_lists_its_devices(tmp_path: Path) -> None:
    """backend opencl + [backend.opencl] enabled, device_index [0, 1], deviceId 1: one snapshot."""
    settings = {"gpu": {"backend": "opencl", "deviceId": 1}}
    snapshot = load_pair(tmp_path, settings, OPENCL_CONFIG.format(devices="[0, 1]"))
    assert snapshot.backend == "opencl"
    assert snapshot.opencl_device_ids() == [0, 1]
    assert snapshot.config.backend.opencl.platform_index == 0


def test_device_index_takes_one_index_or_all(tmp_path: Path) -> None:
    """device_index 0 and "all" come back as [0] and "all" (the default is 0)."""
    settings = {"gpu": {"backend": "opencl"}}
    assert load_pair(tmp_path, settings, OPENCL_CONFIG.format(devices="0")).opencl_device_ids() == [
        0
    ]
    every = load_pair(tmp_path, settings, OPENCL_CONFIG.format(devices='"all"'))
    assert every.opencl_device_ids() == "all"


def test_device_id_outside_the_opencl_devices_names_both_keys(tmp_path: Path) -> None:
    """gpu.deviceId 2, device_index [0, 1]: an error on settings.json gpu.deviceId, with the fix."""
    settings = {"gpu": {"backend": "opencl", "deviceId": 2}}
    problem = only(
        problems_of(tmp_path, settings, OPENCL_CONFIG.format(devices="[0, 1]")), "gpu.deviceId"
    )
    assert Path(problem.file).name == "settings.json"
    assert "backend.opencl.device_index [0, 1]" in problem.message
    assert problem.fix == "set gpu.deviceId to 0 or 1, or add 2 to backend.opencl.device_index"


def test_opencl_backend_needs_the_opencl_section_enabled(tmp_path: Path) -> None:
    """gpu.backend "opencl" with backend.opencl.enabled = false is an error whose fix spells
    out the opencl combination."""
    config = OPENCL_CONFIG.format(devices="0").replace("enabled = true", "enabled = false")
    problem = only(problems_of(tmp_path, {"gpu": {"backend": "opencl"}}, config), "gpu.backend")
    assert "backend.opencl.enabled = false" in problem.message
    assert 'for opencl: gpu.backend = "opencl"' in problem.fix
    assert "backend.opencl.enabled = true" in problem.fix


def test_a_device_listed_twice_is_an_error(tmp_path: Path) -> None:
    """device_index [0, 0]: config.toml backend.opencl.device_index lists a device twice."""
    problems = problems_of(
        tmp_path, {"gpu": {"backend": "opencl"}}, OPENCL_CONFIG.format(devices="[0, 0]")
    )
    problem = only(problems, "backend.opencl.device_index")
    assert problem.file.endswith("config.toml")
    assert "more than once" in problem.message


def test_changing_the_opencl_devices_rolls_the_workers(tmp_path: Path) -> None:
    """A reload that changes device_index or platform_index needs new workers."""
    settings = {"gpu": {"backend": "opencl"}}
    before = load_pair(tmp_path, settings, OPENCL_CONFIG.format(devices="0"))
    after = load_pair(tmp_path, settings, OPENCL_CONFIG.format(devices="[0, 1]"))
    changes = diff(before, after)
    assert ("config.toml: backend.opencl.device_index", 0, [0, 1]) in changes
    assert needs_restart(changes)
