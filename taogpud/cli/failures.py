"""How taogpuctl explains a failure: one line, a hint, an exit code (see taogpud.cli).

Kept apart from the typer app so that the hot path (cli/hot.py) explains its failures in
the same words without importing typer; the app adds only typer's own usage errors.
"""

from __future__ import annotations

import os

from taogpud.client import ApiError, DaemonUnreachable, NotInGroup
from taogpud.errors import (  # the client loads errors.py already: no cost
    EXIT_FAILED,
    EXIT_NOT_IN_GROUP,
    EXIT_UNREACHABLE,
    EXIT_USAGE,
    CliError,
    ConfigError,
)
from taogpud.i18n import _, user_language


def explain(exc: Exception) -> tuple[str, str, int]:
    """(message, hint, exit code) for any failure but typer's; re-raises a bug under
    TAOGPUCTL_DEBUG."""
    if isinstance(exc, CliError):
        return exc.message, exc.hint, exc.exit_code
    if isinstance(exc, DaemonUnreachable):
        code = EXIT_NOT_IN_GROUP if isinstance(exc, NotInGroup) else EXIT_UNREACHABLE
        return exc.message, exc.hint, code
    if isinstance(exc, ApiError):
        return explain_api_error(exc)
    if isinstance(exc, ConfigError):
        language = user_language()
        return exc.render(language), exc.body(language).hint, EXIT_USAGE
    if os.environ.get("TAOGPUCTL_DEBUG"):
        raise exc
    hint = _("a bug in taogpuctl or taogpud; rerun with TAOGPUCTL_DEBUG=1 for the traceback")
    text = _("internal error: {kind}: {error}")
    return text.format(kind=type(exc).__name__, error=exc), hint, EXIT_FAILED


def explain_api_error(exc: ApiError) -> tuple[str, str, int]:
    """The daemon's error; a validation error in the flags' words, without API code or hint."""
    from taogpud.cli import words as cli_words  # here: orjson is no successful call's cost

    human = cli_words.humanize(exc.message)
    if human is not None:
        return human, "", api_exit_code(exc)
    return f"{exc.message} [{exc.code}]", exc.hint, api_exit_code(exc)


def api_exit_code(exc: ApiError) -> int:
    """4xx: the request was wrong (usage, 2); 429 / 5xx: it could not be done now (1)."""
    if 400 <= exc.http_status < 500 and exc.http_status != 429:
        return EXIT_USAGE
    return EXIT_FAILED
