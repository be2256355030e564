"""How taogpuctl prints: JSON documents, tables, job lines, one-line errors, progress.

stdout holds only the answer (a JSON document with --json, else text: rich tables on a
terminal, plain aligned columns otherwise); warnings, progress and errors go to stderr.

rich is imported the first time a terminal needs it (`stdout` and `stderr` are made on first
use): into a pipe every line is plain, and a start that skips rich is ~25 ms quicker. orjson
and datetime are imported where used, so that `taogpuctl status` into a pipe needs neither.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, TextIO

from taogpud.client import Job, is_finished
from taogpud.i18n import N_, _, ngettext
from taogpud.wire import PingJson, TaskJson

if TYPE_CHECKING:
    from rich.console import Console

GIB = 1024**3
# What makes rich treat a stream as a terminal although it is not a tty (its own variables).
RICH_TERMINAL_ENV = ("FORCE_COLOR", "TTY_INTERACTIVE", "TTY_COMPATIBLE", "FORCE_TERMINAL")


@functools.cache
def console(to_stderr: bool = False) -> Console:
    """The rich console of stdout (or stderr), made on first use."""
    from rich.console import Console

    return Console(stderr=to_stderr, highlight=False, soft_wrap=True, emoji=False, markup=False)


def __getattr__(name: str) -> Console:
    """`output.stdout` and `output.stderr`: the two consoles, made when first named."""
    if name in ("stdout", "stderr"):
        return console(to_stderr=name == "stderr")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def plain(stream: TextIO) -> bool:
    """Plain lines, no rich: the stream is no terminal and nothing asks rich to style it."""
    if any(os.environ.get(name) for name in RICH_TERMINAL_ENV):
        return False
    try:
        return not stream.isatty()
    except (AttributeError, ValueError):  # a closed or replaced stream: rich would say no tty
        return True


def emit_json(document: Any) -> None:
    import orjson

    sys.stdout.write(orjson.dumps(document, option=orjson.OPT_INDENT_2).decode() + "\n")


def emit_line(text: str) -> None:
    if plain(sys.stdout):
        print(text)
    else:
        console().print(text)


def emit_table(columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    """A rich table on a terminal, plain aligned columns otherwise."""
    cells = [[format_cell(value) for value in row] for row in rows]
    columns = [heading(column) for column in columns]
    if not plain(sys.stdout) and console().is_terminal:
        from rich import box
        from rich.table import Table

        table = Table(*columns, box=box.SIMPLE_HEAD)
        for row in cells:
            table.add_row(*row)
        console().print(table)
        return
    widths = [max(len(text) for text in column) for column in zip(columns, *cells, strict=True)]
    for row in [list(columns), *cells]:
        padded = (text.ljust(width) for text, width in zip(row, widths, strict=True))
        print("  ".join(padded).rstrip())


def emit_mapping(mapping: Mapping[str, Any], indent: str = "") -> None:
    """`key: value` lines; nested values as compact JSON; empty values left out."""
    for key, value in mapping.items():
        if value in (None, {}, []):
            continue
        emit_line(f"{indent}{key}: {compact_json(value)}")


# Table headings as a person reads them (the same names are --json keys, which stay).
HEADINGS = frozenset(
    (
        N_("id"),
        N_("task"),
        N_("status"),
        N_("backend"),
        N_("device"),
        N_("fallback"),
        N_("queue_ms"),
        N_("run_ms"),
        N_("index"),
        N_("pid"),
        N_("state"),
        N_("running"),
        N_("slots"),
        N_("jobs_done"),
        N_("restarts"),
        N_("name"),
        N_("description"),
        N_("params"),
        N_("uuid"),
        N_("total"),
        N_("used"),
        N_("free"),
        N_("util"),
        N_("worker"),
        N_("owner"),
        N_("memory"),
        N_("temp"),
        N_("power"),
        N_("slot"),
        N_("job"),
        N_("user"),
        N_("elapsed"),
        N_("priority"),
        N_("waiting"),
        N_("cc"),
    )
)


def heading(column: str) -> str:
    return _(column) if column in HEADINGS else column


def compact_json(value: Any) -> str:
    """A string as it is, anything else as compact JSON."""
    if isinstance(value, str):
        return value
    import orjson

    return orjson.dumps(value).decode()


def format_cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return _("yes") if value else _("no")
    if isinstance(value, float):
        return f"{value:.2f}"
    return str(value)


def gibibytes(value: Any) -> str:
    return "-" if not value else f"{value / GIB:.1f} GiB"


def milliseconds(value: Any) -> str:
    return "-" if value is None else f"{float(value):.2f}ms"


def warn(text: str) -> None:
    line = _("WARNING: {text}").format(text=text)
    if plain(sys.stderr):
        print(line, file=sys.stderr)
    else:
        console(to_stderr=True).print(line, style="bold yellow")


def error_line(message: str, hint: str = "") -> str:
    """`taogpuctl: <message> (hint: ...)`, always one line."""
    line = f"taogpuctl: {one_line(message)}"
    return _("{line} (hint: {hint})").format(line=line, hint=one_line(hint)) if hint else line


def report_error(message: str, hint: str = "") -> None:
    # Plain write, not rich: it must come out whole even right after a Ctrl-C.
    sys.stderr.write(error_line(message, hint) + "\n")
    sys.stderr.flush()


def one_line(text: str) -> str:
    return " ".join(text.split())


# --- jobs --------------------------------------------------------------------------------


def summary_line(job: Job) -> str:
    """The line the setup guide's check prints: where it ran and how long it took."""
    # The key=value part is the guide's grep (`device=gpu:0 backend=cuda`): never translated.
    return (
        _("job {job_id} {status}").format(job_id=job["id"], status=state_word(job["status"]))
        + f" task={job['task']} "
        f"device={job.get('device') or '-'} backend={job.get('backend') or '-'} "
        f"fallback={str(bool(job.get('fallback'))).lower()} "
        f"queue={milliseconds(job.get('queue_ms'))} run={milliseconds(job.get('run_ms'))}"
    )


# A job's state as a person reads it; the state names themselves (--json, the API) stay.
STATE_WORDS = {
    "queued": N_("queued"),
    "running": N_("running"),
    "succeeded": N_("succeeded"),
    "failed": N_("failed"),
    "cancelled": N_("cancelled"),
    "timed_out": N_("timed_out"),
    "interrupted": N_("interrupted"),
}


def state_word(status: str) -> str:
    return _(STATE_WORDS[status]) if status in STATE_WORDS else status


def warn_if_fallback(job: Job) -> None:
    if job.get("fallback"):
        reason = job.get("fallback_reason") or _("no reason recorded")
        text = _("job {job_id} ran on the CPU fallback ({device}), not a GPU: {reason}")
        warn(text.format(job_id=job["id"], device=job.get("device"), reason=reason))


def job_problem(job: Job) -> tuple[str, str]:
    """Why a job did not succeed, as (message, hint)."""
    if not is_finished(job):
        hint = _("wait longer: taogpuctl wait {job_id} --timeout S").format(job_id=job["id"])
        still = _("job {job_id} is still {status}")
        return still.format(job_id=job["id"], status=state_word(job["status"])), hint
    error: Mapping[str, Any] = job.get("error") or {}
    code, message = error.get("code", job["status"]), error.get("message", "")
    detail = message if code == job["status"] else f"{code}: {message}"
    ended = _("job {job_id} {status}: {detail}")
    return ended.format(job_id=job["id"], status=state_word(job["status"]), detail=detail), str(
        error.get("hint") or ""
    )


def readable_job(job: Job) -> dict[str, Any]:
    """The record with times as local ISO timestamps and milliseconds rounded, for reading."""
    shown: dict[str, Any] = dict(job)
    for key, value in job.items():
        if key.endswith("_at") and isinstance(value, int | float):
            shown[key] = local_time(value)
        elif key.endswith("_ms") and isinstance(value, float):
            shown[key] = round(value, 2)
        elif key == "timings" and isinstance(value, dict):
            shown[key] = {name: rounded_ms(ms) for name, ms in value.items()}
    return shown


def local_time(epoch_s: float) -> str:
    """`2026-12-01 20:24:34.888 UTC`: the host's zone, named, to the millisecond."""
    from datetime import datetime

    moment = datetime.fromtimestamp(epoch_s).astimezone()
    return f"{moment.isoformat(sep=' ', timespec='milliseconds')[:23]} {moment.tzname()}"


def rounded_ms(value: Any) -> Any:
    return round(value, 2) if isinstance(value, float) else value


class Progress:
    """Where a waited job is: a live line on a terminal, else a stderr line per new state."""

    def __init__(self, quiet: bool) -> None:
        self._quiet = quiet  # no plain lines (--json); the live line is on stderr and stays
        self._started = time.monotonic()
        self._last_job: Job | None = None
        self._live = None if plain(sys.stderr) else _live_line(console(to_stderr=True))

    def __enter__(self) -> Progress:
        if self._live is not None:
            self._live.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        if self._live is not None:
            self._live.stop()
        if exc_type is KeyboardInterrupt and self._last_job is not None:
            job_id = self._last_job["id"]
            hint = _("taogpuctl wait {job_id}, or taogpuctl cancel {job_id}").format(job_id=job_id)
            stopped = _("stopped waiting; job {job_id} is still {status}")
            status = state_word(self._last_job["status"])
            report_error(stopped.format(job_id=job_id, status=status), hint)

    def update(self, job: Job) -> None:
        print_line = self._live is None and self._should_print(job)
        self._last_job = job  # first: a Ctrl-C from here on can name the job
        if self._live is not None:
            self._live.update(self.describe(job))
        elif print_line:
            print(self.describe(job), file=sys.stderr)

    def describe(self, job: Job) -> str:
        state = _("done") if is_finished(job) else state_word(job["status"])
        seconds = f"{time.monotonic() - self._started:.1f}"
        if job.get("device"):
            text = _("job {job_id} {state} on {device} ({seconds}s)")
            return text.format(job_id=job["id"], state=state, device=job["device"], seconds=seconds)
        return _("job {job_id} {state} ({seconds}s)").format(
            job_id=job["id"], state=state, seconds=seconds
        )

    def _should_print(self, job: Job) -> bool:
        """A plain line per state still in progress; the finished one is the summary's job."""
        last_status = None if self._last_job is None else self._last_job["status"]
        return not self._quiet and not is_finished(job) and job["status"] != last_status


def _live_line(stderr: Console) -> Any:
    """rich's spinner line on a terminal; None where rich sees none (a forced, dumb one)."""
    from rich.status import Status

    return Status(_("submitting…"), console=stderr) if stderr.is_terminal else None


# --- catalog and config --------------------------------------------------------------------


def describe_params(task: TaskJson) -> str:
    """`size:integer=1000000 seed:integer=0` from the params' JSON schema."""
    schema = task.get("params") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, field in (schema.get("properties") or {}).items():
        kinds = [field.get("type")] if "type" in field else field.get("anyOf", [])
        kind = "|".join(str(k.get("type") if isinstance(k, dict) else k) for k in kinds)
        default = _(" (required)") if name in required else default_text(field.get("default"))
        parts.append(f"{name}:{kind}{default}")
    return " ".join(parts)


def default_text(default: Any) -> str:
    """`=1000000`, `=float32`, `=[1,2]`; no default at all reads `(optional)`, not `=None`."""
    if default is None:
        return _(" (optional)")
    return f"={compact_json(default)}"


def problem_line(problem: dict[str, str]) -> str:
    """`file: key: message (fix: ...)`; a warning says so after the key."""
    severity = _("warning: ") if problem.get("severity") == "warning" else ""
    return _("{file}: {key}: {severity}{message} (fix: {fix})").format(  # as Problem.line
        file=problem.get("file", "?"),
        key=problem.get("key", "?"),
        severity=severity,
        message=problem.get("message", ""),
        fix=problem.get("fix", ""),
    )


def count_problems(errors: Sequence[object], warnings: Sequence[object]) -> str:
    """`2 errors, 1 warning`."""
    return _("{errors}, {warnings}").format(
        errors=ngettext("{n} error", "{n} errors", len(errors)).format(n=len(errors)),
        warnings=ngettext("{n} warning", "{n} warnings", len(warnings)).format(n=len(warnings)),
    )


def flatten(document: dict[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested tables as dotted keys: ("settings.gpu.backend", "cpu")."""
    for key, value in document.items():
        if isinstance(value, dict) and value:
            yield from flatten(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


# --- api ping and doctor ---------------------------------------------------------------------

CHECK_MARKS = {"pass": "✓", "warn": "!", "fail": "✗", "skip": "-"}


def ping_lines(result: PingJson) -> list[str]:
    """`✓ api ping ok: MODEL answered in N ms …`, or the status, detail and fix."""
    if result.get("ok"):
        model = result.get("answered_model") or result.get("model")
        attempts = result.get("attempts", 1)
        tries = _(", {n} attempts").format(n=attempts) if attempts and attempts > 1 else ""
        text = _("api ping ok: {model} answered in {latency} at {url} (key from {source}{tries})")
        latency = milliseconds(result.get("latency_ms"))
        source = result.get("key_source")
        answer = text.format(
            model=model, latency=latency, url=result.get("url"), source=source, tries=tries
        )
        return [f"{CHECK_MARKS['pass']} {answer}"]
    failed = _("api ping {status}: {detail}")
    lines = [
        f"{CHECK_MARKS['fail']} "
        + failed.format(status=result.get("status"), detail=result.get("detail"))
    ]
    if result.get("hint"):
        lines.append("  " + _("fix: {fix}").format(fix=result["hint"]))
    return lines


def check_lines(checks: Sequence[dict[str, str]]) -> list[str]:
    """The doctor's checklist, one line per check (✓ ! ✗ -), its fix below, then a count."""
    width = max((len(check["name"]) for check in checks), default=0)
    lines = []
    for check in checks:
        mark = CHECK_MARKS.get(check["status"], "?")
        lines.append(f"{mark} {check['name'].ljust(width)}  {check['detail']}")
        if check.get("hint"):
            label = _("fix: {fix}") if check["status"] in ("fail", "warn") else _("note: {fix}")
            lines.append(f"  {' ' * width}  " + label.format(fix=check["hint"]))
    counts = dict.fromkeys(CHECK_MARKS, 0)
    for check in checks:
        counts[check["status"]] = counts.get(check["status"], 0) + 1
    tally = _("doctor: {failed} failed, {warned} warned, {passed} passed, {skipped} skipped")
    lines.append(
        tally.format(
            failed=counts["fail"],
            warned=counts["warn"],
            passed=counts["pass"],
            skipped=counts["skip"],
        )
    )
    return lines
