"""The message catalogs: `make i18n` rebuilds them, `make check` checks them.

    python -m scripts.i18n           extract every marked string (`_`, `N_`, `Text`, `ngettext`)
                                     from taogpud/ into taogpud/i18n/locale/taogpud.pot, merge it
                                     into each language's .po (translations kept, new entries
                                     empty), and compile each .po to the .mo the package ships
    python -m scripts.i18n --check   fail (exit 1, one line per problem) when a marked string
                                     has no translation, a translation's {placeholders} differ
                                     from its English original's (str.format would raise at run
                                     time), or a shipped .mo is not its .po compiled

Babel does the extracting, merging and compiling (a development tool, in the `dev` extra);
at run time only the stdlib's gettext reads the .mo.
"""

from __future__ import annotations

import argparse
import io
import string
import sys
from collections.abc import Iterator
from pathlib import Path

from babel.messages.catalog import Catalog, Message
from babel.messages.extract import extract_from_dir
from babel.messages.mofile import write_mo
from babel.messages.pofile import read_po, write_po

ROOT = Path(__file__).resolve().parent.parent
LOCALE = ROOT / "taogpud" / "i18n" / "locale"
TEMPLATE = LOCALE / "taogpud.pot"
KEYWORDS = {"_": None, "N_": None, "Text": None, "ngettext": (1, 2)}


def extracted() -> Catalog:
    """Every string marked for translation in taogpud/, as a template catalog."""
    template = Catalog(project="taogpud", domain="taogpud")
    found = extract_from_dir(
        ROOT / "taogpud", method_map=[("**.py", "python")], keywords=KEYWORDS, comment_tags=()
    )
    for filename, lineno, message, _comments, context in found:
        template.add(message, None, [(f"taogpud/{filename}", lineno)], context=context)
    for text in command_help():
        template.add(text, None, [("taogpud/cli (help)", 0)])
    return template


def command_help() -> list[str]:
    """taogpuctl's help texts, read off the click tree typer builds (taogpud/cli/helptext.py)."""
    import typer

    from taogpud.cli.app import app
    from taogpud.cli.helptext import help_texts

    return list(dict.fromkeys(help_texts(typer.main.get_command(app))))


def catalogs() -> Iterator[Path]:
    yield from sorted(LOCALE.glob("*/LC_MESSAGES/taogpud.po"))


def read(path: Path) -> Catalog:
    with path.open("rb") as po:
        return read_po(po, domain="taogpud")


def rebuild() -> None:
    """The template from the code, each .po merged with it, each .mo compiled from its .po."""
    template = extracted()
    with TEMPLATE.open("wb") as pot:
        write_po(pot, template, omit_header=True, no_location=True, sort_output=True)
    for po_path in catalogs():
        catalog = read(po_path)
        created = catalog.creation_date  # kept: a date that changed at every run made conflicts
        catalog.update(template, no_fuzzy_matching=True)
        catalog.creation_date = created
        catalog.obsolete.clear()  # a string gone from the code has no use in the catalog
        with po_path.open("wb") as po:
            write_po(po, catalog, no_location=True, sort_output=True, width=100)
        po_path.with_suffix(".mo").write_bytes(compiled(read(po_path)))
        print(f"i18n: {po_path.relative_to(ROOT)}: {len(catalog)} entries")


def compiled(catalog: Catalog) -> bytes:
    out = io.BytesIO()
    write_mo(out, catalog, use_fuzzy=False)
    return out.getvalue()


def placeholders(text: str) -> set[str]:
    return {name for _literal, name, _spec, _conv in string.Formatter().parse(text) if name}


def entry_problems(language: str, message: Message) -> Iterator[str]:
    """What is wrong with one entry: missing, fuzzy, or placeholders unlike the English."""
    originals = message.id if isinstance(message.id, tuple) else (message.id,)
    strings = message.string if isinstance(message.string, tuple) else (message.string,)
    where = f"{language}: {originals[0]!r}"
    if message.fuzzy or not all(strings):
        yield f"{where}: no translation"
        return
    wanted = placeholders(originals[-1])  # a plural's forms all take the plural's names
    for translated in strings:
        if placeholders(translated) != wanted:
            yield f"{where}: placeholders {sorted(placeholders(translated))} != {sorted(wanted)}"


def check() -> list[str]:
    template = extracted()
    problems: list[str] = []
    for po_path in catalogs():
        language = po_path.parent.parent.name
        catalog = read(po_path)
        for original in template:
            if not original.id:
                continue
            entry = catalog.get(original.id)
            if entry is None:
                problems.append(f"{language}: {original.id!r}: not in {po_path.name}")
            else:
                problems.extend(entry_problems(language, entry))
        mo_path = po_path.with_suffix(".mo")
        if not mo_path.is_file() or mo_path.read_bytes() != compiled(catalog):
            problems.append(f"{language}: {mo_path.name} is not {po_path.name} compiled")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="check, change nothing")
    if not parser.parse_args().check:
        rebuild()
        return 0
    problems = check()
    for problem in problems:
        print(f"i18n: {problem}", file=sys.stderr)
    if problems:
        print("i18n: fix the .po, then run `make i18n`", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
