"""What a child process inherits: the daemon's environment, never the API key.

The daemon keeps the key's variables in its own environment (a reload reads them again),
but no worker, helper or multiprocessing's resource tracker gets them: a child's initial
environment stays readable in /proc/<pid>/environ for as long as it lives, by its owner and
by anything that can ptrace it, however the child edits os.environ later.

Spawned processes (multiprocessing) take the environment as it is when they start, so the
variables are taken out for the moment of the start and put back at once
(`without_secrets`); a subprocess gets `child_env()`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

DEFAULT_KEY_ENV = "TAOTOKEN_API_KEY"
_names: set[str] = {DEFAULT_KEY_ENV}


def keep_from_children(*names: str) -> None:
    """Add variables no child may inherit (api.api_key_env, as the config names it)."""
    _names.update(name for name in names if name)


def child_env() -> dict[str, str]:
    """The environment for a subprocess: the daemon's, without the key's variables."""
    return {name: value for name, value in os.environ.items() if name not in _names}


@contextlib.contextmanager
def without_secrets() -> Iterator[None]:
    """os.environ without the key's variables within the block (start children there).
    Call from the event loop's thread: the block holds no await, so nothing of the daemon
    reads the environment meanwhile."""
    hidden = {name: os.environ.pop(name) for name in list(_names) if name in os.environ}
    try:
        yield
    finally:
        os.environ.update(hidden)
