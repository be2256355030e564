"""Build taogpud's packages: one staged tree, then a .deb (dpkg-deb) or an RPM (the spec).

    .venv/bin/python packaging/build.py deb [--extras cuda12] [--out dist]
    .venv/bin/python packaging/build.py stage DESTDIR [--unitdir /usr/lib/systemd/system]

Run it with the Python of an environment that holds taogpud's runtime closure: `make deb`
fills build/deb-venv from the hashed lock file (packaging/locks/<extras or cpu>.txt,
--require-hashes) and runs it there; the systemd tests run it with the project's venv. The
application goes into a private venv under /opt/taogpud that runs on the distribution's
python3, and is filled from that environment: taogpud from this source tree, its runtime
dependencies (and those of --extras) copied as installed. build.py itself needs no network.
Installing needs no network either: nothing is fetched by a maintainer script.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from taogpud.host.install_hints import PACKAGE_MARKER

REPO = Path(__file__).resolve().parent.parent
PREFIX = Path("/opt/taogpud")
TARGET_PYTHON = "/usr/bin/python3"  # the distribution's interpreter the package depends on
# RPM's %config(noreplace) pair (the guide's GPU pair). The .deb has no conffiles: its
# postinst writes the pair this host can run where none is (no conffile prompt, ever).
CONFFILES = ("/etc/taogpud/settings.json", "/etc/taogpud/config.toml")
PAIRS = ("/usr/share/doc/taogpud/examples", "/usr/share/taogpud/examples")
SKIPPED_DIST_INFO = {"RECORD", "REQUESTED", "direct_url.json", "INSTALLER"}


def runtime_distributions(extras: Iterable[str]) -> list[metadata.Distribution]:
    """The installed distributions taogpud (with `extras`) needs at run time, taogpud last."""
    wanted = [(canonicalize_name("taogpud"), frozenset(extras))]
    done: set[tuple[str, frozenset[str]]] = set()
    seen: dict[str, metadata.Distribution] = {}
    while wanted:
        key = wanted.pop()
        if key in done:
            continue
        done.add(key)
        name, name_extras = key
        try:
            seen[name] = dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            raise SystemExit(f"build.py: {name} is not installed in {sys.prefix}") from None
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(
                req.marker.evaluate({"extra": extra}) for extra in name_extras | {""}
            ):
                wanted.append((canonicalize_name(req.name), frozenset(req.extras)))
    own = seen.pop(canonicalize_name("taogpud"))
    return [*sorted(seen.values(), key=lambda d: d.metadata["Name"].lower()), own]


def copy_distribution(dist: metadata.Distribution, site: Path) -> None:
    """The files the distribution installed into site-packages (not its scripts or caches)."""
    for file in dist.files or []:
        parts = Path(str(file)).parts
        if parts[0] == ".." or "__pycache__" in parts or file.name in SKIPPED_DIST_INFO:
            continue
        source = Path(str(dist.locate_file(file)))
        if source.is_file():
            (site / file).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, site / file)


def copy_taogpud(dist: metadata.Distribution, site: Path) -> None:
    """The package from this tree (the venv holds it editable), and its dist-info."""
    shutil.copytree(
        REPO / "taogpud", site / "taogpud", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    info = site / f"taogpud-{dist.version}.dist-info"
    info.mkdir()
    for name in ("METADATA", "WHEEL", "entry_points.txt", "top_level.txt"):
        text = dist.read_text(name)
        if text is not None:
            (info / name).write_text(text)
    (info / "INSTALLER").write_text("taogpud packaging/build.py\n")


def make_venv(stage: Path, extras: list[str]) -> None:
    root = stage / PREFIX.relative_to("/")
    _check_python()
    subprocess.run([TARGET_PYTHON, "-m", "venv", "--without-pip", str(root)], check=True)
    for activate in (root / "bin").glob("[Aa]ctivate*"):
        activate.unlink()  # they name the build directory; the service never activates
    cfg = root / "pyvenv.cfg"
    cfg.write_text(
        re.sub(
            r"(?m)^command = .*$", f"command = {TARGET_PYTHON} -m venv {PREFIX}", cfg.read_text()
        )
    )
    # Hints then name what works in a package (another build, the CPU pair), not pip.
    (root / PACKAGE_MARKER).write_text(f"extras={','.join(extras)}\n")
    site = next((root / "lib").glob("python3.*")) / "site-packages"
    dists = runtime_distributions(extras)
    for dist in dists[:-1]:
        copy_distribution(dist, site)
    copy_taogpud(dists[-1], site)
    _write_scripts(root, dists[-1])
    # Byte-compile with the target interpreter, recorded under their installed paths.
    subprocess.run(
        [TARGET_PYTHON, "-m", "compileall", "-q", "-j0", "-s", str(stage), "-p", "/", str(site)],
        check=True,
    )


def _check_python() -> None:
    probe = "import sys; print(*sys.version_info[:2])"
    try:
        out = subprocess.run([TARGET_PYTHON, "-c", probe], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        raise SystemExit(f"build.py: {TARGET_PYTHON} is needed to build the venv: {exc}") from exc
    target = tuple(int(v) for v in out.stdout.split())
    if target != sys.version_info[:2]:
        raise SystemExit(
            f"build.py: {TARGET_PYTHON} is {target}, this environment {sys.version_info[:2]}: "
            "run build.py with a venv of the same Python version"
        )


def _write_scripts(root: Path, dist: metadata.Distribution) -> None:
    for entry in dist.entry_points.select(group="console_scripts"):
        script = root / "bin" / entry.name
        script.write_text(
            f"#!{PREFIX}/bin/python\n"
            "import sys\n"
            f"from {entry.module} import {entry.attr}\n"
            # spawned workers import the main module again: only the real one runs main()
            'if __name__ == "__main__":\n'
            f"    sys.exit({entry.attr}())\n"
        )
        script.chmod(0o755)


def stage_files(stage: Path, unitdir: str) -> None:
    """Units (the relay's socket too, not enabled), sysusers, tmpfiles, the /etc pair (the
    guide's GPU pair), examples, links."""
    put = _Putter(stage)
    for unit in ("taogpud.service", "taogpud.socket"):
        put.copy(REPO / "systemd" / unit, f"{unitdir}/{unit}")
        put.copy(REPO / "systemd" / "user" / unit, f"/usr/lib/systemd/user/{unit}")
    put.copy(REPO / "systemd/taogpud-relay.socket", f"{unitdir}/taogpud-relay.socket")
    put.copy(REPO / "packaging/sysusers.d/taogpud.conf", "/usr/lib/sysusers.d/taogpud.conf")
    put.copy(REPO / "packaging/tmpfiles.d/taogpud.conf", "/usr/lib/tmpfiles.d/taogpud.conf")
    for conffile in CONFFILES:
        put.copy(REPO / "packaging/examples/gpu" / Path(conffile).name, conffile)
    for pair in ("gpu", "cpu"):
        for name in ("settings.json", "config.toml"):
            source = REPO / "packaging/examples" / pair / name
            for folder in PAIRS:
                put.copy(source, f"{folder}/{pair}/{name}")
    put.copy(REPO / "README.md", "/usr/share/doc/taogpud/README.md")
    for doc in sorted((REPO / "docs").glob("*.md")):  # the README's links, readable offline
        put.copy(doc, f"/usr/share/doc/taogpud/docs/{doc.name}")
    for command in ("taogpud", "taogpuctl"):
        put.link(f"{PREFIX}/bin/{command}", f"/usr/bin/{command}")


class _Putter:
    def __init__(self, stage: Path) -> None:
        self.stage = stage

    def copy(self, source: Path, dest: str) -> None:
        target = self.stage / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(source, target)

    def link(self, source: str, dest: str) -> None:
        target = self.stage / dest.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.symlink_to(source)


def stage(dest: Path, extras: list[str], unitdir: str) -> None:
    os.umask(0o022)
    make_venv(dest, extras)
    stage_files(dest, unitdir)


def build_deb(out: Path, extras: list[str], compression: str) -> Path:
    version = metadata.version("taogpud")
    arch = subprocess.run(
        ["dpkg", "--print-architecture"], check=True, capture_output=True, text=True
    ).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="taogpud-deb-") as tmp:
        root = Path(tmp) / "root"
        stage(root, extras, "/lib/systemd/system")  # Debian 12 ships units under /lib
        for conffile in CONFFILES:  # postinst writes the pair this host can run
            (root / conffile.lstrip("/")).unlink()
        _write_control(root, version, arch, extras)
        out.mkdir(parents=True, exist_ok=True)
        deb = out / f"taogpud_{version}_{arch}.deb"
        subprocess.run(
            ["dpkg-deb", "--root-owner-group", f"-Z{compression}", "--build", str(root), str(deb)],
            check=True,
            stdout=subprocess.DEVNULL,
        )
    return deb


def _write_control(root: Path, version: str, arch: str, extras: list[str]) -> None:
    control = root / "DEBIAN"
    control.mkdir()
    size_kib = sum(f.lstat().st_size for f in root.rglob("*") if not f.is_dir()) // 1024
    note = (
        f"This build includes the extras: {', '.join(extras)}."
        if extras
        else "This build has no CUDA support (CuPy): it runs the CPU backend only."
    )
    text = (Path(__file__).parent / "deb" / "control.in").read_text()
    for key, value in {
        "VERSION": version,
        "ARCH": arch,
        "SIZE_KIB": str(size_kib),
        "EXTRAS_NOTE": note,
    }.items():
        text = text.replace(f"@{key}@", value)
    (control / "control").write_text(text)
    for script in ("postinst", "prerm", "postrm"):
        shutil.copy2(Path(__file__).parent / "deb" / script, control / script)
        (control / script).chmod(0o755)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    deb = sub.add_parser("deb", help="build dist/taogpud_<version>_<arch>.deb")
    deb.add_argument("--out", type=Path, default=REPO / "dist")
    deb.add_argument("--compression", default="xz", choices=["xz", "gzip", "zstd", "none"])
    staged = sub.add_parser("stage", help="lay the installed tree out under DESTDIR (RPM)")
    staged.add_argument("destdir", type=Path)
    staged.add_argument("--unitdir", default="/usr/lib/systemd/system")
    for command in (deb, staged):
        command.add_argument(
            "--extras", default="", help="comma-separated extras to include, e.g. cuda12"
        )
    args = parser.parse_args(argv)
    extras = [e for e in args.extras.split(",") if e]
    if args.command == "deb":
        print(build_deb(args.out, extras, args.compression))
    else:
        stage(args.destdir, extras, args.unitdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
