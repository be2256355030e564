"""Placement: which device a job starts on, as pure functions over plain data.

The scheduler owns the queue and the job states. When a slot may be free it describes each
worker as a `Device` and asks `place` where a job goes; at submit it asks `admit` whether
the job can ever run. Nothing here awaits, holds a pool or changes anything: a decision
comes back and the scheduler applies it (the job starts, the round-robin cursor moves, an
affinity key is remembered). The rules, in the order they apply:

1. max_concurrent_tasks: the global cap on running jobs, all devices together;
2. at most stream_count jobs per device (its free slots; a worker that is not warm has none);
3. the memory reserved on a device plus the job's estimate stays within the device's cap;
4. a requested device (`--device N`) is the only candidate, whatever the affinity key says;
5. with gpu_affinity, a key that landed on a device that is still alive waits for it;
6. otherwise the strategy: round_robin (the first eligible device at or after the cursor)
   or least_loaded (the fewest running jobs per slot, the first such device on a tie).

A program (a user's own process under a lease, docs/programs.md) is a job like any other
here, with three more words: `whole` (it takes every slot of its device, so it starts only
on a device that runs nothing: `--share` takes one slot instead), `reserve_cap` (no `--mem`:
it reserves the device's whole cap) and `gang` (`--gpus N`: N devices that fit at once, or
it waits holding none; affinity keys and requested devices are for one device).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, NamedTuple

STRATEGIES = ("round_robin", "least_loaded")


@dataclass(slots=True)
class Device:
    """One worker as placement sees it; nothing here changes one. Not frozen only for speed:
    the scheduler makes one per worker for each placement, and a frozen dataclass is built
    five times slower (1.05 µs against 0.19 µs here). Job and Placement are named tuples."""

    index: int  # the device index jobs name (`--device N`)
    slots: int  # stream_count: jobs it may run at once
    running: int = 0  # jobs on it now
    free_slots: int | None = None  # None: slots - running; 0 while the worker is not warm
    reserved_bytes: int = 0  # memory estimates of the jobs it runs
    cap_bytes: int | None = None  # memoryFraction × total; None where no cap is known
    alive: bool = True  # False: crashed or gone, so an affinity key moves on

    @property
    def free(self) -> int:
        return self.slots - self.running if self.free_slots is None else self.free_slots


class Job(NamedTuple):
    """What placement reads of a job."""

    estimate_bytes: int = 0
    device: int | None = None  # the requested device, if any
    affinity: str | None = None  # the affinity key, if any
    gang: int = 1  # devices it needs at once (a program's --gpus); all or none
    whole: bool = False  # takes every slot of each device (a program without --share)
    reserve_cap: bool = False  # reserves each device's whole cap (a program without --mem)

    def need_bytes(self, device: Device) -> int:
        """The memory it reserves on `device`: its estimate, or the device's cap."""
        if self.reserve_cap and device.cap_bytes is not None:
            return device.cap_bytes
        return self.estimate_bytes


@dataclass(frozen=True, slots=True)
class Rules:
    """The scheduling keys of config.toml that placement obeys."""

    strategy: str = "round_robin"  # round_robin | least_loaded
    gpu_affinity: bool = True
    max_concurrent_tasks: int = 8


class Placement(NamedTuple):
    """A decision: where the job starts, or why it waits; and what to remember after it."""

    position: int | None  # into the devices given; None: the job waits
    reason: str = ""  # why it waits; "" when placed
    rr_next: int = 0  # the round-robin cursor after this decision
    remember: tuple[str, int] | None = None  # affinity key → device index, to record
    also: tuple[int, ...] = ()  # the further positions of a job of count > 1

    @property
    def placed(self) -> bool:
        return self.position is not None

    @property
    def positions(self) -> tuple[int, ...]:
        return () if self.position is None else (self.position, *self.also)


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a job can never run here: refused at submit, never queued."""

    code: Literal["no_such_device", "too_large"]
    message: str
    hint: str


def has_capacity(devices: Sequence[Device], running_total: int, rules: Rules) -> bool:
    """Whether any job could start now: under the global cap and a slot free somewhere."""
    return running_total < rules.max_concurrent_tasks and any(d.free > 0 for d in devices)


def fits(device: Device, job: Job) -> bool:
    """A free slot (every slot, for a whole-device job), and room under the device's memory
    cap for what the job reserves."""
    if device.free <= 0 or (job.whole and device.running > 0):
        return False
    return device.cap_bytes is None or device.reserved_bytes + job.need_bytes(device) <= (
        device.cap_bytes
    )


def place(
    job: Job,
    devices: Sequence[Device],
    rules: Rules,
    *,
    running_total: int = 0,
    rr_next: int = 0,
    affinity: Mapping[str, int] | None = None,
) -> Placement:
    """Where `job` starts now among `devices` (in pool order), or why it waits.

    `rr_next` is the round-robin cursor and `affinity` the keys already placed (key →
    device index), both as the previous decisions left them."""
    if running_total >= rules.max_concurrent_tasks:
        return _wait(f"{running_total} jobs run: the max_concurrent_tasks cap", rr_next)
    if job.gang > 1:
        return _place_together(job, devices, rules, rr_next)
    return _place_one(job, devices, rules, rr_next, affinity or {})


def _place_one(
    job: Job, devices: Sequence[Device], rules: Rules, rr_next: int, affinity: Mapping[str, int]
) -> Placement:
    if job.device is not None:
        return _place_on_requested(job, devices, rules, rr_next, affinity)
    pinned = _pinned(job, devices, rules, affinity)
    if pinned is not None:  # the key's device: wait for it unless it is dead
        if fits(devices[pinned], job):
            return Placement(pinned, rr_next=rr_next)
        why = _why_not(devices[pinned], job)
        return _wait(f"affinity key {job.affinity!r} waits for its device: {why}", rr_next)
    candidates = [p for p, device in enumerate(devices) if fits(device, job)]
    if not candidates:
        return _wait(_nowhere(devices, job), rr_next)
    return _chosen(job, devices, rules, candidates, rr_next)


def _place_on_requested(
    job: Job, devices: Sequence[Device], rules: Rules, rr_next: int, affinity: Mapping[str, int]
) -> Placement:
    """A requested device is the job's only candidate, whatever its affinity key says; a key
    not placed before is remembered there, where it first landed."""
    position = next((p for p, d in enumerate(devices) if d.index == job.device), None)
    if position is None:
        return _wait(f"there is no device {job.device}", rr_next)
    if not fits(devices[position], job):
        return _wait(_why_not(devices[position], job), rr_next)
    decision = _chosen(job, devices, rules, [position], rr_next)
    if job.affinity in affinity:  # the key keeps its device: this job only asked for another
        return Placement(position, rr_next=decision.rr_next)
    return decision


def _place_together(job: Job, devices: Sequence[Device], rules: Rules, rr_next: int) -> Placement:
    """`job.gang` devices that fit now, chosen by the strategy, or none: a job never holds
    one device while it waits for another."""
    candidates = [p for p, device in enumerate(devices) if fits(device, job)]
    if len(candidates) < job.gang:
        free = len(candidates)
        why = _nowhere(devices, job) if not candidates else f"{free} of them fit now"
        return _wait(f"needs {job.gang} devices free together: {why}", rr_next)
    if rules.strategy == "least_loaded":
        chosen = sorted(candidates, key=lambda p: devices[p].running / max(devices[p].slots, 1))
    else:  # from the cursor on, wrapping round
        chosen = sorted(candidates, key=lambda p: (p < rr_next, p))
        rr_next = (chosen[job.gang - 1] + 1) % len(devices)
    first, *rest = chosen[: job.gang]
    return Placement(first, rr_next=rr_next, also=tuple(rest))


def _pinned(
    job: Job, devices: Sequence[Device], rules: Rules, affinity: Mapping[str, int]
) -> int | None:
    """The position of the live device the job's affinity key landed on, if any."""
    if not (rules.gpu_affinity and job.affinity and job.affinity in affinity):
        return None
    index = affinity[job.affinity]
    return next((p for p, d in enumerate(devices) if d.index == index and d.alive), None)


def _chosen(
    job: Job, devices: Sequence[Device], rules: Rules, candidates: list[int], rr_next: int
) -> Placement:
    if rules.strategy == "least_loaded":
        position = min(candidates, key=lambda p: devices[p].running / max(devices[p].slots, 1))
    else:
        position = next((p for p in candidates if p >= rr_next), candidates[0])
        rr_next = (position + 1) % len(devices)
    return Placement(position, rr_next=rr_next, remember=_remember(job, devices[position], rules))


def _remember(job: Job, device: Device, rules: Rules) -> tuple[str, int] | None:
    return (job.affinity, device.index) if rules.gpu_affinity and job.affinity else None


def _wait(reason: str, rr_next: int) -> Placement:
    return Placement(None, reason=reason, rr_next=rr_next)


def _nowhere(devices: Sequence[Device], job: Job) -> str:
    if not devices:
        return "there are no workers"
    return "no device fits: " + "; ".join(_why_not(d, job) for d in devices)


def _why_not(device: Device, job: Job) -> str:
    """Why `job` cannot start on `device` now, in words that carry the numbers."""
    name = f"device {device.index}"
    if job.whole and device.free > 0 and device.running > 0:
        return f"{name} runs {device.running} job(s); the program takes the whole device"
    if device.free <= 0:
        if not device.alive:
            return f"{name} is down"
        if device.running < device.slots:
            return f"{name} is not warm"
        return f"{name} runs {device.running} of its {device.slots} slots"
    cap = device.cap_bytes or 0  # a device with a free slot and no cap fits: not asked
    return (
        f"{name} has {gib(cap - device.reserved_bytes)} of its {gib(cap)} cap free, "
        f"the job needs about {gib(job.need_bytes(device))}"
    )


def admit(
    task: str, estimate_bytes: int, device: int | None, devices: Sequence[Device], count: int = 1
) -> Refusal | None:
    """Whether a job can ever run: its requested device exists, there are as many devices as
    it needs at once, and its memory estimate fits the largest cap among the devices it may
    run on (a device without a known cap, e.g. one still warming, takes no part). None: it
    may queue."""
    known = ", ".join(str(d.index) for d in devices)
    if device is not None and all(d.index != device for d in devices):
        return Refusal("no_such_device", f"there is no device {device}", f"devices: {known}")
    if count > len(devices):
        return Refusal(
            "no_such_device",
            f"{task} needs {count} devices at once; this host has {len(devices)}",
            f"ask for at most {len(devices)} (devices: {known or 'none'})",
        )
    caps = [d.cap_bytes for d in devices if d.cap_bytes is not None and device in (None, d.index)]
    if caps and estimate_bytes > max(caps):
        return Refusal(
            "too_large",
            f"{task} needs about {gib(estimate_bytes)} of device memory; the largest "
            f"device cap is {gib(max(caps))} (gpu.memoryFraction × total)",
            "use a smaller size, or raise gpu.memoryFraction in settings.json",
        )
    return None


def gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:,.2f} GiB"
