"""Every exception of taogpud is defined in taogpud/errors.py, and its docstring draws each one
as it is: the tree's parents are the classes' own bases, and each code and HTTP status drawn is
the class's (a drawing that drifts from the code fails here, not in a reader's head)."""

from __future__ import annotations

import ast
import builtins
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import taogpud
from taogpud import errors

PACKAGE_ROOT = Path(taogpud.__file__).parent
ERRORS_PATH = PACKAGE_ROOT / "errors.py"

# A drawn row: the tree's lines, the class name, and (for the API's rows) its code and status.
ROW = re.compile(
    r"^    (?P<tree>[│├└─ ]*)(?P<name>[A-Z]\w+)(?:\s+(?P<code>[a-z_]+)\s+(?P<http>\d{3}))?"
)


def _base_names(node: ast.ClassDef) -> list[str]:
    """The names of a class's bases, as written (`errors.RequestError` → RequestError)."""
    names = []
    for base in node.bases:
        if isinstance(base, ast.Attribute):
            names.append(base.attr)
        elif isinstance(base, ast.Name):
            names.append(base.id)
    return names


def _classes() -> list[tuple[str, ast.ClassDef]]:
    """Every class defined anywhere in the package, with the module path it is in."""
    found = []
    for path in sorted(PACKAGE_ROOT.rglob("*.py")):
        where = str(path.relative_to(PACKAGE_ROOT.parent))
        found += [
            (where, node)
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.ClassDef)
        ]
    return found


def _is_builtin_exception(name: str) -> bool:
    value = getattr(builtins, name, None)
    return isinstance(value, type) and issubclass(value, BaseException)


def _is_exception_name(base: str, known: set[str]) -> bool:
    return _is_builtin_exception(base) or base.endswith(("Error", "Exception")) or base in known


def exception_classes() -> list[tuple[str, str]]:
    """(module path, class name) of every exception class taogpud defines: a class whose base
    is a built-in exception, a third party's (…Error, …Exception) or another of these."""
    classes = _classes()
    known: set[str] = set()
    while True:
        more = {
            node.name
            for _, node in classes
            if any(_is_exception_name(base, known) for base in _base_names(node))
        }
        if more <= known:
            break
        known |= more
    return [(where, node.name) for where, node in classes if node.name in known]


def test_every_exception_is_defined_in_errors() -> None:
    """No module of taogpud but errors.py defines an exception (taogpuctl's too)."""
    elsewhere = [
        f"{where}: {name}" for where, name in exception_classes() if where != "taogpud/errors.py"
    ]
    assert elsewhere == []


def test_the_walk_finds_exceptions_through_their_bases() -> None:
    """The check itself: a subclass of an exception defined here counts, a plain class not."""
    names = {name for _, name in exception_classes()}
    assert {"TaogpudError", "RequestError", "KernelCompileError", "BadArray"} <= names
    assert "Problem" not in names and "ErrorBody" not in names


def drawn_rows() -> list[tuple[int, str, str | None, str | None]]:
    """(depth in the tree, name, code, HTTP status) of each row the docstring draws."""
    rows = []
    for line in (errors.__doc__ or "").splitlines():
        found = ROW.match(line)
        if found and hasattr(errors, found["name"]):
            rows.append((len(found["tree"]), found["name"], found["code"], found["http"]))
    return rows


def test_the_docstring_draws_every_exception_of_errors() -> None:
    drawn = {name for _, name, _, _ in drawn_rows()}
    defined = {
        name
        for name, value in vars(errors).items()
        if isinstance(value, type)
        and issubclass(value, BaseException)
        and value.__module__ == errors.__name__
    }
    assert defined - drawn == set()


@pytest.mark.parametrize("row", drawn_rows(), ids=lambda row: row[1])
def test_each_drawn_code_and_status_is_the_class_own(
    row: tuple[int, str, str | None, str | None],
) -> None:
    _, name, code, http = row
    if code is None:
        return  # a row of the exceptions never answered as they are: no code to compare
    cls = getattr(errors, name)
    assert (cls.code, cls.http_status) == (code, int(http or 0))


def test_the_tree_drawn_is_the_classes_own() -> None:
    """Each row with a code is drawn under its class's own base (the row above it, one
    level less deep)."""
    parents: dict[int, str] = {}
    checked = 0
    for depth, name, code, _ in drawn_rows():
        parents[depth] = name
        if code is None or depth == 0:
            continue
        above = max(d for d in parents if d < depth)
        assert getattr(errors, name).__bases__[0] is getattr(errors, parents[above]), name
        checked += 1
    assert checked > 20


def test_errors_is_light_enough_for_the_client() -> None:
    """The client takes its exceptions from errors.py: importing it loads nothing of taogpud
    but the wire and the catalogs, and no dataclasses (a config Problem is config's)."""
    probe = (
        "import sys, taogpud.errors\n"
        "print(sorted(m for m in sys.modules if m.startswith('taogpud') or m == 'dataclasses'))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": str(PACKAGE_ROOT.parent)},
    )
    assert done.stdout.split("\n")[0] == str(
        ["taogpud", "taogpud.errors", "taogpud.i18n", "taogpud.wire"]
    )
