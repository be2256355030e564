"""The task registry: the built-ins, then plug-ins from the entry-point group `taogpud.tasks`.

An entry point names a `Task`, a list of them, or a function returning either:

    [project.entry-points."taogpud.tasks"]
    my_tasks = "my_package.tasks:TASKS"

A plug-in that fails to import, yields something else, or reuses a taken name
is skipped with a logged reason (also kept in `plugin_problems()` for doctor);
it never stops the daemon, and never replaces a built-in.

The daemon imports this module, so nothing here imports numpy or cupy.
"""

from __future__ import annotations

import difflib
import importlib.metadata
import threading
from collections.abc import Iterable, Mapping
from typing import Any

import structlog
from pydantic import BaseModel, ValidationError

from taogpud.errors import InvalidParams, JobCancelled, UnknownTask
from taogpud.i18n import Text
from taogpud.tasks.base import Task, TaskContext, TaskOutput

__all__ = [
    "ENTRY_POINT_GROUP",
    "JobCancelled",
    "Task",
    "TaskContext",
    "TaskOutput",
    "all_tasks",
    "check_input_names",
    "get",
    "plugin_problems",
    "reload_plugins",
    "validate_params",
]

ENTRY_POINT_GROUP = "taogpud.tasks"

# ---------------------------------------------------------------------------- lookup


def get(name: str) -> Task:
    """The task called `name`, or UnknownTask naming the close ones."""
    tasks = _registry.tasks()
    task = tasks.get(name)
    if task is not None:
        return task
    close = difflib.get_close_matches(name, list(tasks), n=3, cutoff=0.6)
    if close:
        guess = " or ".join(repr(c) for c in close)
        message = Text("no task named {name}; did you mean {guess}?", name=repr(name), guess=guess)
    else:
        message = Text("no task named {name}", name=repr(name))
    hint = Text("known tasks: {tasks} (`taogpuctl tasks` lists them)", tasks=", ".join(tasks))
    raise UnknownTask(message, hint=hint)


def all_tasks() -> list[Task]:
    """Built-ins first, in their catalog order, then plug-ins in the order they loaded."""
    return list(_registry.tasks().values())


def plugin_problems() -> list[str]:
    """Why each skipped plug-in was skipped, one sentence each."""
    return _registry.problems()


def reload_plugins() -> list[str]:
    """Scan the entry points again (after installing a plug-in); returns the problems."""
    _registry.forget()
    return _registry.problems()


class _Registry:
    """The tasks by name, built on first use and rebuilt after `forget()`."""

    def __init__(self) -> None:
        # Re-entrant: a plug-in may look a task up while it is being loaded.
        self._lock = threading.RLock()
        self._tasks: dict[str, Task] | None = None
        self._problems: list[str] = []

    def tasks(self) -> dict[str, Task]:
        with self._lock:  # slot threads may ask at the same moment on first use
            if self._tasks is None:
                self._tasks, self._problems = _build()
            return self._tasks

    def problems(self) -> list[str]:
        with self._lock:
            self.tasks()
            return list(self._problems)

    def forget(self) -> None:
        with self._lock:
            self._tasks = None


_registry = _Registry()


def _build() -> tuple[dict[str, Task], list[str]]:
    from taogpud.tasks.builtin import BUILTIN_TASKS
    from taogpud.tasks.kernel import KERNEL_TASK
    from taogpud.tasks.opencl_tasks import with_opencl

    tasks = {task.name: task for task in (*with_opencl(BUILTIN_TASKS), KERNEL_TASK)}
    problems: list[str] = []
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        problems.extend(_add_plugin(tasks, entry_point))
    log = structlog.get_logger("taogpud.tasks")  # at call time: a cached logger misses reconfig
    for problem in problems:
        log.warning("task_plugin_skipped", problem=problem)
    return tasks, problems


# ---------------------------------------------------------------------------- plug-ins


def _add_plugin(tasks: dict[str, Task], entry_point: importlib.metadata.EntryPoint) -> list[str]:
    """Load one entry point into `tasks`; returns what was wrong with it, if anything."""
    where = f"task plug-in {entry_point.name!r} ({entry_point.value})"
    try:
        found = _tasks_from(entry_point.load())
    except (Exception, SystemExit) as exc:  # a plug-in's import may raise anything
        return [f"{where} failed to load and was skipped: {type(exc).__name__}: {exc}"]
    problems = []
    for task in found:
        problem = _plugin_task_problem(tasks, task)
        if problem:
            problems.append(f"{where}: {problem}")
        else:
            tasks[task.name] = task
    return problems


def _tasks_from(loaded: Any) -> list[Any]:
    if callable(loaded) and not isinstance(loaded, type):
        loaded = loaded()  # a factory function
    if isinstance(loaded, Task):
        return [loaded]
    if isinstance(loaded, list | tuple):
        return list(loaded)
    raise TypeError(f"expected a Task or a list of Tasks, got {type(loaded).__name__}")


def _plugin_task_problem(tasks: Mapping[str, Task], task: Any) -> str | None:
    if not isinstance(task, Task):
        return f"skipped {type(task).__name__} {task!r:.60}: not a taogpud Task"
    if not (isinstance(task.params, type) and issubclass(task.params, BaseModel)):
        return f"skipped task {task.name!r}: its params is not a pydantic model"
    if task.name in tasks:
        return f"skipped task {task.name!r}: that name is already taken"
    return None


# ---------------------------------------------------------------------------- validation


def validate_params(task: Task, params: Any) -> BaseModel:
    """Params as the task's model, or InvalidParams naming each bad field, what was
    given and what is allowed."""
    try:
        return task.params.model_validate(params)
    except ValidationError as exc:
        fields = task.params.model_json_schema().get("properties", {})
        problems = [_describe_error(error, fields) for error in exc.errors()]
        raise InvalidParams(
            f"invalid params for {task.name}: {'; '.join(problems)}",
            hint=f"{task.name} takes {_allowed(fields)}",
        ) from None


def check_input_names(task: Task, names: Iterable[str]) -> None:
    """InvalidParams when a job names an input array the task does not take."""
    unknown = sorted(set(names) - set(task.inputs))
    if unknown:
        takes = ", ".join(task.inputs) if task.inputs else "no inputs"
        raise InvalidParams(
            f"{task.name} has no input {', '.join(map(repr, unknown))}",
            hint=f"{task.name} takes {takes}",
        )


def _describe_error(error: Mapping[str, Any], fields: Mapping[str, Any]) -> str:
    field = ".".join(str(part) for part in error["loc"]) or "params"
    given = _short(error.get("input"))
    if error["type"] == "extra_forbidden":
        close = difflib.get_close_matches(field, list(fields), n=1)
        guess = f", did you mean {close[0]!r}?" if close else ""
        return f"{field}: unknown parameter (given {given}){guess}"
    if error["type"] == "missing":
        return f"{field}: required, not given"
    return f"{field}: {error['msg']} (given {given})"


def _allowed(fields: Mapping[str, Any]) -> str:
    if not fields:
        return "no parameters"
    return "; ".join(_describe_field(name, schema) for name, schema in fields.items())


def _describe_field(name: str, schema: Mapping[str, Any]) -> str:
    """'size: integer 1..2**48 (default 1000000)' from the field's JSON schema."""
    if "enum" in schema:
        kind = " | ".join(str(value) for value in schema["enum"])
    else:
        kind = str(schema.get("type", "value"))
        low, high = schema.get("minimum"), schema.get("maximum")
        if low is not None or high is not None:
            kind += f" {_bound(low)}..{_bound(high)}"
    default = f" (default {schema['default']})" if "default" in schema else ""
    return f"{name}: {kind}{default}"


def _bound(value: Any) -> str:
    if value is None:
        return ""
    # Large powers of two read better as such: 2**48, not 281474976710656.
    if isinstance(value, int) and value >= 2**20:
        if value & (value - 1) == 0:
            return f"2**{value.bit_length() - 1}"
        if value & (value + 1) == 0:
            return f"2**{value.bit_length()}-1"
    return str(value)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
