"""The rooms talk downwards: a module never imports a layer above it, lazily or not.

Each module's AST is walked whole, so an import inside a function counts as much as one at
the top: backends never import tasks (tasks hand backends what they need, tasks/warmup.py),
the pool that spawns them or the doctor that reads them (what a child inherits is the host's,
host/environ.py; the OpenCL check is the doctor's, doctor/opencl.py); the client takes the
.npy header from wire.py, never from the daemon's array files; what the scheduler sees of a
pool (pool/interface.py) names no executor's workers; placement stays pure (nothing of
taogpud, no asyncio), and the core under the API (the scheduler, the pool, the relay, the
daemon) never imports it: what they share with it, the Unix socket and SO_PEERCRED, is a leaf
of the standard library (taogpud/host/unix_socket.py), as all of host/ and wire.py are.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

import taogpud

PACKAGE_ROOT = Path(taogpud.__file__).parent

# (modules whose names start with this, imported names that may not start with any of these)
RULES = [
    # a backend is given what it runs; the pool spawns it and the doctor reads it
    ("taogpud.backends", ("taogpud.tasks", "taogpud.pool", "taogpud.doctor")),
    # the client speaks wire.py (the .npy header included) and its own memfd, nothing above
    (
        "taogpud.client",
        ("taogpud.arrayfiles", "taogpud.api", "taogpud.daemon", "taogpud.jobs", "taogpud.pool"),
    ),
    # the client's memory is the client's to use: client/ calls memfd/client.py, handing it
    # its socket and itself as what the HTTP fallback needs (memfd.client.OverHttp)
    ("taogpud.memfd", ("taogpud.client",)),
    # what the scheduler sees of a pool, never one executor's workers
    (
        "taogpud.pool.interface",
        ("taogpud.pool.worker", "taogpud.pool.supervisor", "taogpud.pool.ray_pool"),
    ),
    ("taogpud.jobs.placement", ("taogpud", "asyncio")),
    # the scheduler and what it leans on (admission, run queue, placer, programs, store)
    ("taogpud.jobs", ("taogpud.api", "taogpud.daemon")),
    # a program's mechanisms (/proc and pidfds, its proof, its log); its scheduling is jobs'
    ("taogpud.programs", ("taogpud.jobs", "taogpud.api", "taogpud.daemon")),
    ("taogpud.pool", ("taogpud.api",)),
    # the relay serves; `taogpuctl relay` (cli/relay.py, cli/toolfiles.py) is the CLI's
    ("taogpud.relay", ("taogpud.api", "taogpud.cli")),
    ("taogpud.daemon", ("taogpud.api",)),
    ("taogpud.host.unix_socket", ("taogpud.api", "starlette", "fastapi", "uvicorn")),
    # what taogpud says about itself writes lines and serves collectors it is handed: a job's
    # line is the jobs' (jobs/trace_line.py), the daemon's collector the daemon's
    ("taogpud.observability", ("taogpud.jobs", "taogpud.daemon", "taogpud.api", "taogpud.relay")),
    # `taogpuctl mcp` serves its tools through the client, as taogpuctl does: what both use
    # (a job id's prefix, the evidence's nvidia-smi table) sits below them, never in cli/
    ("taogpud.agents", ("taogpud.cli",)),
    # one policy under every listener: it counts a connection's PeerCred, not a job's Peer
    (
        "taogpud.doors",
        ("taogpud.api", "taogpud.daemon", "taogpud.relay", "taogpud.jobs", "starlette", "fastapi"),
    ),
]

# The two modules above the API: the composition step builds the app and hands the `.shm`
# socket the API's request validation (rather than have memfd/server.py import it); the
# lifecycle serves the app and ends its waiting requests at a stop. These names and no
# others (a new one is a choice to make here, not a slip).
SERVES_THE_API = {
    "taogpud.daemon.compose": {
        "taogpud.api.app.create_app",
        "taogpud.api.models.job_request_from",
    },
    "taogpud.daemon.lifecycle": {"taogpud.api.jobs.end_waits"},
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE_ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path) -> list[tuple[int, str]]:
    """Every name an import statement in `path` brings in, with its line."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return names_in(path.read_text(), package)


def names_in(source: str, package: str) -> list[tuple[int, str]]:
    """The names the imports of `source` bring in, anywhere in it, as absolute dotted names
    (a relative import resolved against `package`, the module's own package)."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def modules_under(prefix: str) -> list[Path]:
    return [
        path
        for path in sorted(PACKAGE_ROOT.rglob("*.py"))
        if module_name(path) == prefix or module_name(path).startswith(prefix + ".")
    ]


def _is_under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize(("layer", "forbidden"), RULES, ids=[rule[0] for rule in RULES])
def test_no_module_imports_a_layer_above_it(layer: str, forbidden: tuple[str, ...]) -> None:
    """No module of `layer` imports any name under `forbidden`, at the top or in a function."""
    paths = modules_under(layer)
    assert paths, f"no module is named {layer}"
    offences = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports {name}"
        for path in paths
        for line, name in imported_names(path)
        if any(_is_under(name, prefix) for prefix in forbidden)
        and name not in SERVES_THE_API.get(module_name(path), ())
    ]
    assert offences == []


# The leaves every room leans on: the standard library and, of taogpud, these alone. The host's
# glue hands up plain values (a connection's PeerCred), which the rooms above build their own
# models from (jobs.records.Peer.of), never the other way.
STANDARD_LIBRARY_ONLY = {
    "taogpud.host": ("taogpud.host", "taogpud.wire", "taogpud.errors", "taogpud.i18n"),
    "taogpud.wire": ("taogpud.wire",),
}


def _is_standard_library(name: str) -> bool:
    return name.split(".", maxsplit=1)[0] in sys.stdlib_module_names


@pytest.mark.parametrize(
    ("leaf", "allowed"), STANDARD_LIBRARY_ONLY.items(), ids=list(STANDARD_LIBRARY_ONLY)
)
def test_a_leaf_imports_the_standard_library_alone(leaf: str, allowed: tuple[str, ...]) -> None:
    """Every import of `leaf`'s modules is the standard library's or one of `allowed`."""
    offences = [
        f"{path.relative_to(PACKAGE_ROOT.parent)}:{line} imports {name}"
        for path in modules_under(leaf)
        for line, name in imported_names(path)
        if not _is_standard_library(name) and not any(_is_under(name, p) for p in allowed)
    ]
    assert offences == []


def test_the_walk_sees_lazy_and_relative_imports() -> None:
    """The check itself: imports inside functions, and relative ones, are all found."""
    source = (
        "def f():\n    from taogpud.tasks import get\n"
        "    class C:\n        import taogpud.tasks.builtin\n"
        "    from ..tasks import warmup\n    from . import cpu\n"
    )
    names = sorted(name for _, name in names_in(source, "taogpud.backends"))
    assert names == [
        "taogpud.backends.cpu",
        "taogpud.tasks.builtin",
        "taogpud.tasks.get",
        "taogpud.tasks.warmup",
    ]


def test_the_module_that_serves_the_api_still_imports_what_it_may() -> None:
    """Each name SERVES_THE_API allows is still imported there: the exemption never outlives
    its reason (a name gone from the module is dropped from the list too)."""
    for module, allowed in SERVES_THE_API.items():
        path = PACKAGE_ROOT.parent.joinpath(*module.split(".")).with_suffix(".py")
        assert allowed <= {name for _, name in imported_names(path)}, module


# bench/ and scripts/ are run from a checkout and from a package alike: what they share with
# the tests (the fake provider, the fuzzer, the harness) lives in taogpud.testing, never in
# tests/. A test module's own name counts too: a folder put on sys.path imports it bare.
REPO_ROOT = Path(__file__).resolve().parents[1]
OUTSIDE_TESTS = ("bench", "scripts", "taogpud")


def test_nothing_outside_the_tests_imports_them() -> None:
    test_modules = {"tests"} | {path.stem for path in (REPO_ROOT / "tests").glob("*.py")}
    offences = [
        f"{path.relative_to(REPO_ROOT)}:{line} imports {name}"
        for folder in OUTSIDE_TESTS
        for path in sorted((REPO_ROOT / folder).rglob("*.py"))
        for line, name in names_in(path.read_text(), folder)
        if name.split(".")[0] in test_modules
    ]
    assert offences == []
