"""The wheels a GPU host without network needs for taogpud (`make gpu-wheels`), derived.

Carried = taogpud's runtime closure (its dependencies in pyproject.toml, followed through the
distributions installed beside this interpreter, at the versions installed there, i.e. the
versions the tests ran with), minus what packaging/gpu-host/packages.txt says that host has
at a version every edge of the closure accepts. A host package whose version is not known
(`# unknown`) or does not satisfy the closure is carried too: on the host the carried wheels
come first on PYTHONPATH, so ours shadows it.

Where this interpreter does not have taogpud's dependencies (no venv), pip resolves the
closure for Python 3.12 instead, pinned to the host's versions.

    python3 scripts/gpu_wheels.py --list          # the carried set, name==version a line
    python3 scripts/gpu_wheels.py --dest .whl     # downloads it; .whl/ is replaced only
                                                  # once the whole download succeeded
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
HOST_LIST = REPO / "packaging" / "gpu-host" / "packages.txt"
# The GPU host's interpreter, for environment markers (PEP 508)
HOST_ENVIRONMENT = {
    "python_version": "3.12",
    "python_full_version": "3.12.3",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
}
PLATFORMS = ["manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64",
             "manylinux_2_5_x86_64", "manylinux1_x86_64", "any"]  # fmt: skip
DOWNLOAD_TIMEOUT_S = 600


def canonical(name: str) -> str:
    """PEP 503: 'Typing_Extensions' and 'typing-extensions' are one package."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass(frozen=True)
class HostPackage:
    name: str
    version: str
    tag: str  # "" (known), "assumed", "unknown" or "gpu-only"

    @property
    def trusted(self) -> bool:
        """Whether taogpud may rely on this version being on the host."""
        return self.tag in {"", "assumed"}


def read_host_list(path: Path = HOST_LIST) -> dict[str, HostPackage]:
    packages: dict[str, HostPackage] = {}
    for raw in path.read_text().splitlines():
        line, _, comment = raw.partition("#")
        if not line.strip():
            continue
        name, _, version = line.strip().partition("==")
        tag = comment.split()[0] if comment.split() else ""
        packages[canonical(name)] = HostPackage(canonical(name), version.strip(), tag)
    return packages


@dataclass
class Node:
    version: str
    specifiers: list[str] = field(default_factory=list)  # what every edge into it asks


def project_requirements() -> list[str]:
    """taogpud's own runtime dependencies, from this tree (not the installed metadata,
    which is whatever tree was installed in editable mode)."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return list(project["dependencies"])


def installed_closure(roots: list[str]) -> dict[str, Node]:
    """Follow the requirements through this interpreter's installed distributions."""
    from packaging.requirements import Requirement

    closure: dict[str, Node] = {}
    pending = [(Requirement(text), "") for text in roots]
    seen: set[tuple[str, str]] = set()
    while pending:
        requirement, extra = pending.pop()
        if requirement.marker and not requirement.marker.evaluate(
            {**HOST_ENVIRONMENT, "extra": extra}
        ):
            continue
        name = canonical(requirement.name)
        node = closure.setdefault(name, Node(metadata.version(requirement.name)))
        node.specifiers.append(str(requirement.specifier))
        for wanted in ["", *sorted(requirement.extras)]:
            if (name, wanted) in seen:
                continue
            seen.add((name, wanted))
            for text in metadata.requires(requirement.name) or []:
                pending.append((Requirement(text), wanted))
    return closure


def carried_from_installed(host: dict[str, HostPackage]) -> dict[str, str]:
    from packaging.specifiers import SpecifierSet

    carried = {}
    for name, node in installed_closure(project_requirements()).items():
        have = host.get(name)
        accepted = have is not None and all(
            SpecifierSet(spec).contains(have.version, prereleases=True) for spec in node.specifiers
        )
        if not (have is not None and have.trusted and accepted):
            carried[name] = node.version
    return carried


def carried_from_resolver(host: dict[str, HostPackage], python: str) -> dict[str, str]:
    """No installed closure here: pip resolves taogpud for Python 3.12 on the host's pins.

    `--ignore-requires-python`: pip 23 checks Requires-Python against the interpreter it
    runs on, not `--python-version`; the cp312 platform tags still pick the binary wheels."""
    with tempfile.TemporaryDirectory() as scratch:
        constraints = Path(scratch) / "host.txt"
        pins = [f"{p.name}=={p.version}\n" for p in host.values() if p.trusted]
        constraints.write_text("".join(pin for pin in pins if not pin.startswith("python==")))
        report = Path(scratch) / "report.json"
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--dry-run", "--ignore-installed",
             "--report", str(report), "--ignore-requires-python",
             "--target", str(Path(scratch) / "site"),
             "-c", str(constraints), *_target_options(), str(REPO)],
            check=True, timeout=DOWNLOAD_TIMEOUT_S,
        )  # fmt: skip
        resolved = json.loads(report.read_text())["install"]
    carried = {}
    for item in resolved:
        name, version = canonical(item["metadata"]["name"]), item["metadata"]["version"]
        have = host.get(name)
        if name != "taogpud" and not (have is not None and have.trusted):
            carried[name] = version
    return carried


def carried(host: dict[str, HostPackage], python: str) -> tuple[dict[str, str], str]:
    """The carried set, and how it was derived."""
    try:
        return carried_from_installed(host), f"installed closure ({sys.executable})"
    except (ImportError, metadata.PackageNotFoundError) as exc:
        print(f"gpu-wheels: no installed closure here ({exc}); asking pip's resolver")
        return carried_from_resolver(host, python), "pip's resolver (no installed closure)"


def _target_options() -> list[str]:
    options = ["--only-binary=:all:", "--python-version", "3.12", "--implementation", "cp"]
    for platform in PLATFORMS:
        options += ["--platform", platform]
    return options


def present(dest: Path) -> dict[str, str]:
    """The wheels already in dest, name → version (from the wheel file names)."""
    found = {}
    for path in dest.glob("*.whl"):
        name, version = path.name.split("-")[:2]
        found[canonical(name)] = version
    return found


def download(pins: dict[str, str], dest: Path, python: str) -> None:
    """Into a fresh folder beside dest, then swapped in: a failed download keeps the old.
    Nothing to do where dest holds exactly these wheels already."""
    if present(dest) == pins:
        print(f"gpu-wheels: {dest} already holds exactly these wheels")
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    fresh = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=dest.parent))
    try:
        subprocess.run(
            [python, "-m", "pip", "download", "-q", "--no-deps", *_target_options(),
             "-d", str(fresh), *(f"{name}=={version}" for name, version in sorted(pins.items()))],
            check=True, timeout=DOWNLOAD_TIMEOUT_S,
        )  # fmt: skip
        if missing := set(pins) - set(present(fresh)):
            raise SystemExit(f"gpu-wheels: pip downloaded no wheel for {sorted(missing)}")
        if dest.exists():
            shutil.rmtree(dest)
        fresh.rename(dest)
    finally:
        shutil.rmtree(fresh, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dest", type=Path, default=REPO / ".whl")
    parser.add_argument("--list", action="store_true", help="print the carried set only")
    parser.add_argument("--python", default=sys.executable, help="the pip to download with")
    args = parser.parse_args()
    pins, how = carried(read_host_list(), args.python)
    if args.list:
        print("\n".join(f"{name}=={version}" for name, version in sorted(pins.items())))
        return 0
    download(pins, args.dest, args.python)
    size_mb = sum(path.stat().st_size for path in args.dest.glob("*.whl")) / 1e6
    print(f"gpu-wheels: {len(pins)} wheels, {size_mb:.1f} MB in {args.dest}, from {how}:")
    print("  " + " ".join(f"{name}=={version}" for name, version in sorted(pins.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
