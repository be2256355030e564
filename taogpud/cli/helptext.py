"""taogpuctl's help in the user's language.

The help texts are the commands' docstrings and the options' `help=`, as typer builds them
into (its own vendored) click commands: one walk over that tree lists them for the catalog
(scripts/i18n.py) and, at run time, puts each into the user's language. No string is marked
twice, and a new command's help reaches the catalog check by being there.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from taogpud.i18n import _, user_language

HelpSlot = tuple[Any, str, str]  # (a command or a parameter, "help" | "short_help", the text)


def help_texts(command: Any) -> Iterator[str]:
    """Every help text of `command` and the commands under it, in tree order."""
    for _owner, _slot, text in _slots(command):
        yield text


def translate(command: Any) -> None:
    """Each help text of the tree in the user's language (English: left as it is)."""
    if user_language() is None:
        return
    for owner, slot, text in list(_slots(command)):
        setattr(owner, slot, _(text))


def _slots(command: Any) -> Iterator[HelpSlot]:
    """A command's help and short help, its parameters' help, then its sub-commands'."""
    for slot in ("help", "short_help"):
        if getattr(command, slot, None):
            yield command, slot, getattr(command, slot)
    for param in command.params:
        if getattr(param, "help", None):
            yield param, "help", param.help
    for sub in (getattr(command, "commands", None) or {}).values():
        yield from _slots(sub)
