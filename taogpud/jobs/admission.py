"""Admission: whether a job may enter, decided before anything of it is made.

A job enters while the daemon takes jobs and its store can be written (check_open); its task
is on and has a body for every backend the pool runs, its params validate, and its inputs
exist, are the submitter's and of its dtype (check_job); its memory estimate fits some
device's cap, the device it names exists, and the bounded queue has room (check_room, over
the same view of the devices placement then gets). A program is admitted by what it reserves
(check_executor, check_program_room). Nothing here changes any state: a refusal is an
exception saying what was wrong and how to fix it.
"""

from __future__ import annotations

from typing import Any, NamedTuple, cast

from taogpud import tasks
from taogpud.arrayfiles.store import ArrayStore, check_dtypes
from taogpud.errors import (
    Draining,
    QueueFull,
    Rejected,
    RequestError,
    TaskDisabled,
    UnsupportedExecutor,
)
from taogpud.i18n import Text
from taogpud.jobs import placement
from taogpud.jobs.memory import JobRegions
from taogpud.jobs.policy import Policy
from taogpud.jobs.records import PROGRAM_TASK, Peer
from taogpud.jobs.store import JobStore
from taogpud.pool.interface import Pool
from taogpud.tasks.kernel import KERNEL_TASK_NAME
from taogpud.wire import JobRequest, ProgramRequest


class Admitted(NamedTuple):
    """What admission found out about a job it let in."""

    task: tasks.Task
    params: Any  # the task's params model, validated
    estimate: int  # bytes: the task's estimate and its inputs


def check_open(accepting: bool, store: JobStore) -> None:
    if not accepting:
        raise Draining(
            Text("taogpud is stopping and takes no new jobs"),
            Text("submit again once it is back"),
        )
    store.check_writable()  # a full disk refuses new jobs before any is made


def check_job(
    request: JobRequest,
    peer: Peer,
    regions: JobRegions | None,
    policy: Policy,
    arrays: ArrayStore,
    pool: Pool,
) -> Admitted:
    """The task, its params and its inputs; with `regions` (memfd/server.py) the inputs are
    in the client's own memory instead of the array store."""
    task = tasks.get(request.task)
    _check_enabled(task, policy)
    _check_backend(task, pool)
    validated = tasks.validate_params(task, request.params)
    if regions is None:
        _check_inputs(task, validated, request.inputs, peer, arrays)
        estimate = task.estimate_bytes(validated) + _input_bytes(request.inputs, arrays)
    else:  # the client's own memory: its region refs carry the dtypes to check
        tasks.check_input_names(task, regions.inputs)
        check_dtypes(task.name, _dtype_param(validated), regions.inputs)
        estimate = task.estimate_bytes(validated) + regions.input_bytes()
    return Admitted(task, validated, estimate)


def check_room(
    request: JobRequest,
    estimate: int,
    devices: list[placement.Device],
    queued: int,
    policy: Policy,
) -> None:
    """Some device can hold the job (placement.admit), and the queue has room for it."""
    refusal = placement.admit(request.task, estimate, request.device, devices)
    if refusal is not None:
        error = RequestError if refusal.code == "no_such_device" else Rejected
        raise error(refusal.message, refusal.hint)
    if queued >= policy.queue_limit:
        raise QueueFull(
            Text("the queue is full ({n} jobs waiting)", n=policy.queue_limit),
            Text("retry later, or raise scheduling.queue_limit in config.toml"),
        )


def check_executor(pool: Pool) -> None:
    """Programs run beside the daemon's own workers, on this host."""
    if pool.executor != "local":
        raise UnsupportedExecutor(
            f"programs run under the local executor only; this daemon runs executor "
            f"{pool.executor!r}",
            'run it on a daemon with executor = "local" (docs/programs.md)',
        )


def check_program_room(
    request: ProgramRequest, devices: list[placement.Device], queued: int, policy: Policy
) -> None:
    """Its devices can hold what it reserves (--gpus, --mem), and the queue has room."""
    mem = request.mem_bytes or 0
    refusal = placement.admit(PROGRAM_TASK, mem, request.device, devices, request.gpus)
    if refusal is not None:
        error = RequestError if refusal.code == "no_such_device" else Rejected
        hint = "ask for less with --mem" if refusal.code == "too_large" else refusal.hint
        raise error(refusal.message.replace("needs about", "reserves"), hint)
    if queued >= policy.queue_limit:
        raise QueueFull(
            f"the queue is full ({policy.queue_limit} jobs waiting)",
            "retry later, or raise scheduling.queue_limit in config.toml",
        )


def _check_enabled(task: tasks.Task, policy: Policy) -> None:
    if task.name == KERNEL_TASK_NAME and not policy.allow_user_kernels:
        raise TaskDisabled(
            Text("the kernel task (CUDA C from clients) is off on this host"),
            Text(
                "an administrator can set allow_user_kernels = true under [backend.cuda] "
                "in config.toml"
            ),
        )


def _check_backend(task: tasks.Task, pool: Pool) -> None:
    """A task runs only where it has an implementation: never on the host instead."""
    for backend in sorted({w.spec.backend for w in pool.workers}):
        task.body_for(backend)  # raises UnsupportedTask, naming the backends it has


def _check_inputs(
    task: tasks.Task, params: Any, inputs: dict[str, str], peer: Peer, arrays: ArrayStore
) -> None:
    """Each input is known, the submitter's own (arrayfiles/store.py) and of the job's dtype."""
    tasks.check_input_names(task, inputs)
    refs = arrays.inputs_for(peer, inputs)
    check_dtypes(task.name, _dtype_param(params), refs)


def _input_bytes(inputs: dict[str, str], arrays: ArrayStore) -> int:
    refs = (arrays.get(array_id) for array_id in inputs.values())
    return sum(ref.nbytes for ref in refs if ref is not None)


def _dtype_param(params: Any) -> str | None:
    """The job's `dtype` param, if its task has one. A params model keeps its fields in its
    __dict__; getattr of one it lacks goes through pydantic's __getattr__ and an exception
    (2 µs, on every job of a task without one)."""
    return cast("str | None", vars(params).get("dtype"))
