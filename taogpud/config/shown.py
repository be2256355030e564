"""What of a config value may be shown: never the key, nor anything shaped like one.

    hide(text, known)      `text` with the known keys, key-shaped tokens and URL userinfo
                           replaced by <redacted>
    hide_tree(tree, known) the same in every string of a nested dict/list (a config view)
    shaped_in(tree)        the key-shaped tokens and userinfo found in a tree (for the log's
                           scrubber: a key typed into the wrong field is kept out of every line)

The key typed into the wrong field (provider.baseUrl, timeoutMs, models, api.api_key_env, the
userinfo of a URL) is not known as the key, so it is recognised by its shape: a token with a
key prefix (`sk-`, `sk-ant-`, `pk_`, `rk-`, `tgr_` ...) and 16 more characters, or any run of
32 or more letters, digits, `-` and `_` with at least four of each of letters and digits in
it (no word, path or model name is that long unbroken with that many digits; a UUID is hidden
too, which costs nothing in a config).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

REDACTED = "<redacted>"
_TOKEN = r"[A-Za-z0-9_\-]"
KEY_SHAPED = re.compile(
    rf"(?<!{_TOKEN})(?:"
    rf"(?:sk|pk|rk|ak|tgr)[-_]{_TOKEN}{{16,}}"  # sk-..., sk-ant-..., sk-proj-..., tgr_...
    rf"|(?=(?:[A-Za-z_\-]*\d){{4}})(?=(?:[0-9_\-]*[A-Za-z]){{4}}){_TOKEN}{{32,}}"  # long, mixed
    rf")(?!{_TOKEN})"
)
USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.\-]*://)[^/?#@\s\"']+@")


def hide(text: str, known: Iterable[str] = ()) -> str:
    for secret in known:
        if secret and len(secret) >= 4:
            text = text.replace(secret, REDACTED)
    text = USERINFO.sub(rf"\1{REDACTED}@", text)
    return KEY_SHAPED.sub(REDACTED, text)


def hide_tree(tree: Any, known: Iterable[str] = ()) -> Any:
    known = tuple(known)
    if isinstance(tree, str):
        return hide(tree, known)
    if isinstance(tree, dict):
        return {hide(str(key), known): hide_tree(value, known) for key, value in tree.items()}
    if isinstance(tree, list):
        return [hide_tree(item, known) for item in tree]
    return tree


def shaped_in(tree: Any) -> list[str]:
    """Every key-shaped token and URL userinfo in the strings (and keys) of `tree`."""
    found: list[str] = []
    for text in _strings(tree):
        found += KEY_SHAPED.findall(text)
        found += [match.group(0)[len(match.group(1)) : -1] for match in USERINFO.finditer(text)]
    return list(dict.fromkeys(found))


def _strings(tree: Any) -> Iterable[str]:
    if isinstance(tree, str):
        yield tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield str(key)
            yield from _strings(value)
    elif isinstance(tree, list):
        for item in tree:
            yield from _strings(item)
