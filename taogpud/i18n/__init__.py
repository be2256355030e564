"""The user's language: gettext catalogs for what taogpud says to a person.

Machine-readable text never comes through here: `--json`, error codes, trace and journal
lines, metrics and the API's JSON keys are English, byte for byte, in every locale.

- `_("text")` translates now, into this process's user's language: `TAOGPUD_LANG` forces one,
  else the first of `LC_ALL`, `LC_MESSAGES`, `LANG` that is set (C's own order).
- `N_("text")` only marks a string for extraction: a constant translated where it is shown.
- `Text("job {job_id} not found", job_id=…)`: a message whose language is chosen later, by
  whoever shows it (the daemon answers in the request's `Accept-Language`); `str()` is English.

English is the source language and the fallback for anything without an entry. Catalogs are
`locale/<lang>/LC_MESSAGES/taogpud.po`, compiled to `.mo` by `make i18n` (Babel);
`scripts/i18n.py --check` (in `make check`) fails on a missing entry or a placeholder that
differs from the English one. Terms: `GLOSSARY.md` beside this file.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gettext

DOMAIN = "taogpud"
LOCALE_DIR = Path(__file__).parent / "locale"
# The catalogs shipped, and what each is asked for by: zh, zh-CN, zh-Hans, zh_CN.UTF-8.
SUPPORTED = {"zh_CN": ("zh", "zh_cn", "zh_hans", "zh_hans_cn", "zh_sg")}
USER_VARIABLES = ("LC_ALL", "LC_MESSAGES", "LANG")


def catalog_for(tag: str | None) -> str | None:
    """The shipped catalog a locale name or language tag asks for; None is English.

    `zh_CN.UTF-8`, `zh-CN`, `zh-Hans`, `zh` → "zh_CN"; `C`, `POSIX`, `en_US.UTF-8` → None.
    """
    if not tag:
        return None
    base = tag.split(".")[0].split("@")[0].replace("-", "_").lower()
    for name, asked_by in SUPPORTED.items():
        if base in asked_by:
            return name
    return None


_english_only = False  # set by `english_only()`: this process answers machines


def english_only() -> None:
    """From now on this process speaks English whatever the locale (`taogpuctl --json`: a
    document for a program, the daemon's words in it included)."""
    global _english_only  # noqa: PLW0603 - one switch for the process, set once at its start
    _english_only = True


def user_language(environ: Mapping[str, str] | None = None) -> str | None:
    """This process's user's catalog (None: English), from the environment."""
    if environ is None and _english_only:
        return None
    env = os.environ if environ is None else environ
    forced = env.get("TAOGPUD_LANG")
    if forced:
        return catalog_for(forced)
    for name in USER_VARIABLES:
        if env.get(name):
            return catalog_for(env[name])
    return None


def accepted_language(header: str | None) -> str | None:
    """The catalog an `Accept-Language` header prefers (highest q first), None: English."""
    if not header:
        return None
    items = [_weighed(position, item) for position, item in enumerate(header.split(","))]
    for _minus_q, _position, tag in sorted(items):  # highest q first, then as sent
        if _minus_q >= 0:  # q=0: "not this one", and all after it too
            return None
        if tag.lower().startswith("en"):
            return None  # English asked for before any catalog we have
        if catalog_for(tag):
            return catalog_for(tag)
    return None


def _weighed(position: int, item: str) -> tuple[float, int, str]:
    """(-q, position, tag) of one `tag;q=0.8` item: sorted, the preferred one comes first."""
    tag, _sep, params = item.strip().partition(";")
    q = 1.0
    if params.strip().startswith("q="):
        try:
            q = float(params.strip()[2:])
        except ValueError:
            q = 0.0
    return -q, position, tag.strip()


def http_tag(language: str | None) -> str | None:
    """The `Accept-Language` value a client sends for a catalog: "zh_CN" → "zh-CN"."""
    return None if language is None else language.replace("_", "-")


@functools.cache
def translations(language: str | None) -> gettext.NullTranslations:
    import gettext  # here: a client that only reads the environment never pays for it

    if language is None:
        return gettext.NullTranslations()
    return gettext.translation(DOMAIN, LOCALE_DIR, languages=[language], fallback=True)


def _(message: str) -> str:
    """`message` in the user's language (itself where the catalog has no entry)."""
    return in_language(message, user_language())


def N_(message: str) -> str:
    """Marks `message` for the catalog without translating it here."""
    return message


def in_language(message: str, language: str | None) -> str:
    # English needs no catalog: a command in English never imports gettext
    return message if language is None else translations(language).gettext(message)


class Text(str):
    """A message with named placeholders, put into a language when it is shown.

    It is the English text itself (a str: logs, traces, `--json`, and any code that only reads
    it), and keeps its template and values so that `text.render(lang)` can speak to a person.
    """

    template: str
    params: dict[str, object]

    def __new__(cls, template: str, /, **params: object) -> Text:
        english = template.format(**{name: str(value) for name, value in params.items()})
        text = super().__new__(cls, english)
        text.template, text.params = template, params
        return text

    def render(self, language: str | None) -> str:
        """In `language`; a value that is itself a Text is put in the same language."""
        if language is None:
            return str.__str__(self)
        values = {name: render(value, language) for name, value in self.params.items()}
        return in_language(self.template, language).format(**values)

    def cleaned(self, clean: Callable[[str], str]) -> Text:
        """This text with `clean` applied to each value put into it (never to the template)."""
        values = {
            name: value.cleaned(clean) if isinstance(value, Text) else clean(str(value))
            for name, value in self.params.items()
        }
        return Text(self.template, **values)

    def __getnewargs_ex__(self) -> tuple[tuple[str], dict[str, object]]:
        # pickle and copy make it again from its template and values, not from the English
        # (whose braces, a JSON value's say, would not survive a second format())
        return (self.template,), self.params

    def __repr__(self) -> str:
        return f"Text({self.template!r}, **{self.params!r})"


def render(message: object, language: str | None) -> str:
    """A message for a person in `language`: a `Text` translated, anything else as str()."""
    return message.render(language) if isinstance(message, Text) else str(message)


def ngettext(singular: str, plural: str, n: int) -> str:
    """`singular` or `plural` by `n`, in the user's language (Chinese has one form)."""
    language = user_language()
    if language is None:
        return singular if n == 1 else plural
    return translations(language).ngettext(singular, plural, n)


def joined(separator: str, parts: Sequence[str]) -> Text:
    """`separator.join(parts)` that a person reads with each part in their language (a part
    that is a Text is translated; the template is not in a catalog, so it stays as it is)."""
    escaped = separator.replace("{", "{{").replace("}", "}}")
    names = [f"p{index}" for index in range(len(parts))]
    template = escaped.join("{" + name + "}" for name in names)
    values = dict(zip(names, parts, strict=True))
    return Text(template, **values)
