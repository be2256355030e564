"""The hashed lock files (packaging/locks/, `make lock`) against pyproject.toml: every
requirement of taogpud and of the extra each lock is for has a pin there that satisfies it,
and every pin carries hashes, so `pip install --require-hashes` (`make deb`, `make demo`)
installs exactly what was locked. A dependency added or raised in pyproject.toml without
`make lock` fails here, offline."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
LOCKS = REPO / "packaging" / "locks"
SHIPPED = {"cpu": (), "cuda12": ("cuda12",)}  # lock file -> the extras it is for
PIN = re.compile(r"^(?P<name>[A-Za-z0-9._-]+)==(?P<version>\S+)(?:\s*;\s*(?P<marker>[^\\]+))?")


def _pins(lock: Path) -> dict[str, list[tuple[str, str | None]]]:
    """name -> [(version, marker)], and each pin's hashes counted."""
    pins: dict[str, list[tuple[str, str | None]]] = {}
    blocks = re.split(r"\n(?=\S)", lock.read_text())
    for block in blocks:
        found = PIN.match(block)
        if found is None:
            continue
        assert "--hash=sha256:" in block, f"{lock.name}: {found['name']} has no hash"
        marker = found["marker"].strip() if found["marker"] else None
        pins.setdefault(canonicalize_name(found["name"]), []).append((found["version"], marker))
    return pins


def _wanted(extras: tuple[str, ...]) -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    lines = list(project["dependencies"])
    for extra in extras:
        lines += project["optional-dependencies"][extra]
    build = (LOCKS / "build.in").read_text().splitlines()
    lines += [ln for ln in build if ln.strip() and not ln.startswith("#")]
    return [Requirement(line) for line in lines]


def _version_here(pins: list[tuple[str, str | None]]) -> str | None:
    """The pin this interpreter would install (markers evaluated here)."""
    from packaging.markers import Marker

    chosen = [v for v, marker in pins if marker is None or Marker(marker).evaluate()]
    return chosen[0] if chosen else None


@pytest.mark.parametrize("lock", sorted(SHIPPED))
def test_the_lock_satisfies_pyproject(lock: str) -> None:
    """Each requirement (its marker true here) has one pin in the lock, which satisfies it."""
    pins = _pins(LOCKS / f"{lock}.txt")
    stale = []
    for req in _wanted(SHIPPED[lock]):
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        version = _version_here(pins.get(canonicalize_name(req.name), []))
        if version is None or not req.specifier.contains(version, prereleases=True):
            stale.append(f"{req} (locked: {version})")
    assert not stale, f"packaging/locks/{lock}.txt is stale, run `make lock`: {stale}"


def test_only_the_cuda_lock_holds_cupy() -> None:
    """The CPU lock is the CPU build's closure: no CuPy in it; the cuda12 lock has CuPy."""
    assert "cupy-cuda12x" not in _pins(LOCKS / "cpu.txt")
    assert "cupy-cuda12x" in _pins(LOCKS / "cuda12.txt")


def test_every_shipped_lock_is_made_by_make_lock() -> None:
    """`make lock` writes exactly the locks the package and the demo install from."""
    makefile = (REPO / "Makefile").read_text()
    made = re.search(r"^LOCK_EXTRAS := (.+)$", makefile, re.MULTILINE)
    assert made is not None
    assert sorted(made[1].split()) == sorted(SHIPPED)
    assert sorted(p.stem for p in LOCKS.glob("*.txt")) == sorted(SHIPPED)
    for lock in SHIPPED:
        assert (LOCKS / f"{lock}.txt").read_text().splitlines()[1].strip() == "#    make lock"
