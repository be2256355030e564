"""Placement as pure functions (taogpud.jobs.placement): tables of cases, then hypothesis
properties over any devices, jobs and rules. The daemon-level tests of the same rules are in
test_scheduling.py (through a real daemon) and test_scheduler_states.py (the state machine).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from taogpud.jobs.placement import Device, Job, Placement, Rules, admit, has_capacity, place

GIB = 2**30
RR = Rules("round_robin", gpu_affinity=True, max_concurrent_tasks=8)
LEAST = Rules("least_loaded", gpu_affinity=True, max_concurrent_tasks=8)
NO_AFFINITY = Rules("round_robin", gpu_affinity=False, max_concurrent_tasks=8)


def two(**kw: Any) -> list[Device]:
    """Two idle devices of two slots each, with `kw` applied to both."""
    return [Device(0, 2, **kw), Device(1, 2, **kw)]


PLACED_CASES = [
    # (what it shows, job, devices, rules, keyword arguments, position expected)
    ("round_robin starts at the cursor", Job(), two(), RR, {"rr_next": 1}, 1),
    ("round_robin wraps to the first", Job(), two(), RR, {"rr_next": 2}, 0),
    (
        "round_robin skips a full device",
        Job(),
        [Device(0, 2), Device(1, 2, running=2)],
        RR,
        {"rr_next": 1},
        0,
    ),
    (
        "least_loaded takes the fewest running per slot",
        Job(),
        [Device(0, 4, running=2), Device(1, 2, running=1), Device(2, 8, running=2)],
        LEAST,
        {},
        2,
    ),
    ("least_loaded takes the first on a tie", Job(), two(), LEAST, {"rr_next": 1}, 0),
    ("a requested device is the only one", Job(device=1), two(), RR, {"rr_next": 0}, 1),
    (
        "a requested device wins over the affinity key",
        Job(device=1, affinity="k"),
        two(),
        RR,
        {"affinity": {"k": 0}},
        1,
    ),
    (
        "the key's device, not the cursor",
        Job(affinity="k"),
        two(),
        RR,
        {"affinity": {"k": 0}, "rr_next": 1},
        0,
    ),
    (
        "a dead device lets its key move on",
        Job(affinity="k"),
        [Device(0, 2, free_slots=0, alive=False), Device(1, 2)],
        RR,
        {"affinity": {"k": 0}},
        1,
    ),
    (
        "without gpu_affinity the key means nothing",
        Job(affinity="k"),
        two(),
        NO_AFFINITY,
        {"affinity": {"k": 0}, "rr_next": 1},
        1,
    ),
    (
        "memory reserved on a device sends the job to the other",
        Job(estimate_bytes=GIB),
        [Device(0, 2, reserved_bytes=GIB, cap_bytes=GIB), Device(1, 2, cap_bytes=GIB)],
        RR,
        {},
        1,
    ),
    ("no cap known: any estimate fits", Job(estimate_bytes=100 * GIB), two(), RR, {}, 0),
]  # fmt: skip


@pytest.mark.parametrize(
    ("job", "devices", "rules", "kwargs", "expected"),
    [case[1:] for case in PLACED_CASES],
    ids=[case[0] for case in PLACED_CASES],
)
def test_place_chooses(
    job: Job, devices: list[Device], rules: Rules, kwargs: dict[str, Any], expected: int
) -> None:
    """Each case's job starts on the device the rules name."""
    decision = place(job, devices, rules, **kwargs)
    assert decision.position == expected, decision.reason
    assert decision.reason == ""


WAIT_CASES = [
    # (what it shows, job, devices, rules, keyword arguments, words the reason holds)
    ("the global cap", Job(), two(), RR, {"running_total": 8}, "max_concurrent_tasks"),
    (
        "every slot busy",
        Job(),
        two(running=2),
        RR,
        {},
        "device 0 runs 2 of its 2 slots; device 1 runs 2 of its 2 slots",
    ),
    ("a worker still warming", Job(), [Device(0, 2, free_slots=0)], RR, {}, "device 0 is not warm"),
    (
        "the key waits for its busy device while another is idle",
        Job(affinity="k"),
        [Device(0, 1, running=1), Device(1, 1)],
        RR,
        {"affinity": {"k": 0}},
        "affinity key 'k' waits for its device: device 0 runs 1 of its 1 slots",
    ),
    (
        "a requested device that is busy",
        Job(device=0),
        [Device(0, 1, running=1), Device(1, 1)],
        RR,
        {},
        "device 0 runs 1 of its 1 slots",
    ),
    ("a requested device that is gone", Job(device=5), two(), RR, {}, "there is no device 5"),
    (
        "memory already reserved",
        Job(estimate_bytes=GIB),
        [Device(0, 2, reserved_bytes=GIB, cap_bytes=3 * GIB // 2)],
        RR,
        {},
        "device 0 has 0.50 GiB of its 1.50 GiB cap free, the job needs about 1.00 GiB",
    ),
    ("no workers at all", Job(), [], RR, {}, "there are no workers"),
    ("a dead device", Job(), [Device(0, 2, free_slots=0, alive=False)], RR, {}, "device 0 is down"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("job", "devices", "rules", "kwargs", "words"),
    [case[1:] for case in WAIT_CASES],
    ids=[case[0] for case in WAIT_CASES],
)
def test_place_waits_with_a_reason(
    job: Job, devices: list[Device], rules: Rules, kwargs: dict[str, Any], words: str
) -> None:
    """Each case's job waits, and the reason says why in words that carry the numbers."""
    decision = place(job, devices, rules, **kwargs)
    assert decision.position is None
    assert words in decision.reason


def test_round_robin_moves_its_cursor_past_the_device_chosen() -> None:
    """The cursor after a round-robin placement is the next device's position."""
    assert place(Job(), two(), RR, rr_next=0).rr_next == 1
    assert place(Job(), two(), RR, rr_next=1).rr_next == 0


def test_a_new_key_is_remembered_where_it_landed() -> None:
    """A key seen for the first time is to be recorded on the device it starts on, and only
    then."""
    assert place(Job(affinity="k"), two(), RR, rr_next=1).remember == ("k", 1)
    assert place(Job(affinity="k"), two(), NO_AFFINITY).remember is None
    assert place(Job(), two(), RR).remember is None
    assert place(Job(device=1, affinity="k"), two(), RR).remember == ("k", 1)
    # a job that asks for another device than its key's moves neither the key nor its jobs
    assert place(Job(device=1, affinity="k"), two(), RR, affinity={"k": 0}).remember is None


UNEVEN = [Device(0, 1, cap_bytes=GIB // 2), Device(1, 1, cap_bytes=GIB)]
ADMIT_CASES = [
    # (what it shows, estimate, requested device, devices, the refusal's code or None)
    ("fits the largest cap", GIB, None, UNEVEN, None),
    ("over every cap", 2 * GIB, None, [Device(0, 1, cap_bytes=GIB)], "too_large"),
    ("over the requested device's cap", GIB, 0, UNEVEN, "too_large"),
    ("no cap known yet", 100 * GIB, None, [Device(0, 1)], None),
    ("a device that does not exist", 0, 3, [Device(0, 1), Device(1, 1)], "no_such_device"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("estimate", "device", "devices", "code"),
    [case[1:] for case in ADMIT_CASES],
    ids=[case[0] for case in ADMIT_CASES],
)
def test_admit(estimate: int, device: int | None, devices: list[Device], code: str | None) -> None:
    """A job that can never run is refused at submit, with the numbers; else it may queue."""
    refusal = admit("matmul", estimate, device, devices)
    assert (refusal.code if refusal else None) == code


def test_admit_says_the_numbers_and_the_fix() -> None:
    """The too_large refusal names the estimate, the largest cap and the key to raise."""
    refusal = admit("matmul", 2 * GIB, None, [Device(0, 1, cap_bytes=GIB)])
    assert refusal is not None
    assert "2.00 GiB" in refusal.message and "1.00 GiB" in refusal.message
    assert "gpu.memoryFraction" in refusal.hint
    unknown = admit("noop", 0, 3, [Device(0, 1), Device(1, 1)])
    assert unknown is not None and unknown.hint == "devices: 0, 1"


# ---------------------------------------------------------------------------- properties


@st.composite
def devices_st(draw: st.DrawFn) -> list[Device]:
    count = draw(st.integers(0, 5))
    devices = []
    for index in draw(st.permutations(range(8)))[:count]:
        slots = draw(st.integers(1, 4))
        running = draw(st.integers(0, slots))
        warm = draw(st.booleans())
        alive = warm or draw(st.booleans())
        cap = draw(st.none() | st.integers(0, 8 * GIB))
        devices.append(
            Device(
                index=index,
                slots=slots,
                running=running,
                free_slots=(slots - running) if warm else 0,
                reserved_bytes=draw(st.integers(0, cap)) if cap is not None else 0,
                cap_bytes=cap,
                alive=alive,
            )
        )
    return devices


jobs_st = st.builds(
    Job,
    estimate_bytes=st.integers(0, 4 * GIB),
    reserve_cap=st.booleans(),
    device=st.none() | st.integers(0, 8),
    affinity=st.none() | st.sampled_from(["a", "b"]),
)
rules_st = st.builds(
    Rules,
    strategy=st.sampled_from(["round_robin", "least_loaded"]),
    gpu_affinity=st.booleans(),
    max_concurrent_tasks=st.integers(1, 16),
)
affinity_st = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 8))


def _decide(
    job: Job, devices: list[Device], rules: Rules, running: int, cursor: int, keys: dict[str, int]
) -> Placement:
    return place(job, devices, rules, running_total=running, rr_next=cursor, affinity=keys)


@given(jobs_st, devices_st(), rules_st, st.integers(0, 20), st.integers(0, 7), affinity_st)
def test_never_over_a_cap(
    job: Job, devices: list[Device], rules: Rules, running: int, cursor: int, keys: dict[str, int]
) -> None:
    """A job placed is under the global cap, on a free slot, within the device's memory cap
    (what it needs there: its estimate, or the whole cap for a program without --mem)."""
    decision = _decide(job, devices, rules, running, cursor, keys)
    if decision.position is None:
        return
    device = devices[decision.position]
    assert running < rules.max_concurrent_tasks
    assert device.free > 0
    assert (
        device.cap_bytes is None
        or device.reserved_bytes + job.need_bytes(device) <= device.cap_bytes
    )


@given(jobs_st, devices_st(), rules_st, st.integers(0, 20), st.integers(0, 7), affinity_st)
def test_a_requested_device_and_an_affinity_key_are_respected(
    job: Job, devices: list[Device], rules: Rules, running: int, cursor: int, keys: dict[str, int]
) -> None:
    """A requested device is the only place the job starts; else a key on a live device
    keeps its jobs there."""
    decision = _decide(job, devices, rules, running, cursor, keys)
    if decision.position is None:
        return
    chosen = devices[decision.position].index
    key_device = keys.get(job.affinity or "")
    live = {d.index for d in devices if d.alive}
    if job.device is not None:
        assert chosen == job.device
    elif rules.gpu_affinity and key_device in live:
        assert chosen == key_device


@given(jobs_st, devices_st(), rules_st, st.integers(0, 20), st.integers(0, 7), affinity_st)
def test_a_job_waits_only_with_a_reason_and_only_when_it_must(
    job: Job, devices: list[Device], rules: Rules, running: int, cursor: int, keys: dict[str, int]
) -> None:
    """Waiting always comes with a reason; a job free of requests and keys waits only when
    no device fits it or the global cap is reached."""
    decision = _decide(job, devices, rules, running, cursor, keys)
    assert (decision.position is None) == bool(decision.reason)
    unbound = Job(estimate_bytes=job.estimate_bytes)
    free = _decide(unbound, devices, rules, running, cursor, keys)
    fits_somewhere = any(
        d.free > 0 and (d.cap_bytes is None or d.reserved_bytes + job.estimate_bytes <= d.cap_bytes)
        for d in devices
    )
    assert free.placed == (fits_somewhere and running < rules.max_concurrent_tasks)


@given(jobs_st, devices_st(), rules_st, st.integers(0, 20), affinity_st)
def test_has_capacity_is_false_only_when_nothing_could_start(
    job: Job, devices: list[Device], rules: Rules, running: int, keys: dict[str, int]
) -> None:
    """Without capacity no job is placed, whatever it asks for."""
    if not has_capacity(devices, running, rules):
        assert not _decide(job, devices, rules, running, 0, keys).placed


@given(st.integers(1, 6), st.integers(1, 4), st.integers(0, 60), st.integers(0, 5))
def test_round_robin_spreads_jobs_evenly(count: int, slots: int, jobs: int, cursor: int) -> None:
    """Jobs placed one after another over equal devices land on each within one of the others
    (as long as a slot is free somewhere), wherever the cursor started."""
    running = [0] * count
    rules = Rules("round_robin", gpu_affinity=False, max_concurrent_tasks=1000)
    cursor %= count
    for _ in range(min(jobs, count * slots)):
        devices = [Device(i, slots, running=running[i]) for i in range(count)]
        decision = place(Job(), devices, rules, running_total=sum(running), rr_next=cursor)
        assert decision.position is not None, decision.reason
        running[decision.position] += 1
        cursor = decision.rr_next
    assert max(running) - min(running) <= 1


@given(st.lists(st.integers(0, 4), min_size=1, max_size=6))
def test_least_loaded_picks_a_least_loaded_device(running: list[int]) -> None:
    """least_loaded starts the job where running jobs per slot are fewest."""
    devices = [Device(i, 4, running=r) for i, r in enumerate(running)]
    decision = place(Job(), devices, LEAST)
    if min(running) == 4:
        assert not decision.placed
        return
    assert decision.position is not None
    assert running[decision.position] == min(running)


@given(st.integers(1, 5), st.integers(0, 40))
def test_affinity_keeps_a_key_on_one_device_over_many_jobs(count: int, jobs: int) -> None:
    """Placing jobs of keys a, b, c in turn, applying each decision as the scheduler does,
    puts every job of a key on the device its first job landed on."""
    keys: dict[str, int] = {}
    seen: Counter[tuple[str, int]] = Counter()
    devices = [Device(i, 1000) for i in range(count)]
    cursor = 0
    for n in range(jobs):
        key = "abc"[n % 3]
        decision = place(Job(affinity=key), devices, RR, rr_next=cursor, affinity=keys)
        assert decision.position is not None
        cursor = decision.rr_next
        if decision.remember is not None:
            keys[decision.remember[0]] = decision.remember[1]  # as the scheduler records it
        seen[(key, devices[decision.position].index)] += 1
    assert len({key for key, _ in seen}) == len(seen)  # one device per key


# --- programs: a whole device, one slot with --share, the cap without --mem, --gpus N ----


def test_a_whole_device_program_waits_for_a_device_that_runs_nothing() -> None:
    """Without --share a program needs every slot: a device running one task is passed over,
    and with both busy it waits, saying the program takes the whole device."""
    program = Job(whole=True)
    busy_then_idle = [Device(0, 2, running=1), Device(1, 2)]
    assert place(program, busy_then_idle, RR).position == 1
    both_busy = [Device(0, 2, running=1), Device(1, 2, running=1)]
    waiting = place(program, both_busy, RR)
    assert not waiting.placed and "takes the whole device" in waiting.reason


def test_a_shared_program_takes_one_slot_and_reserves_the_cap_without_mem() -> None:
    """--share fits beside a task; without --mem it reserves the device's whole cap, so it
    waits while anything else reserves memory there; with --mem it fits beside it."""
    device = [Device(0, 2, running=1, reserved_bytes=1 * GIB, cap_bytes=8 * GIB)]
    assert place(Job(estimate_bytes=2 * GIB), device, RR).position == 0
    capped = place(Job(reserve_cap=True), device, RR)
    assert not capped.placed and "needs about 8.00 GiB" in capped.reason
    assert place(Job(reserve_cap=True), [Device(0, 2, cap_bytes=8 * GIB)], RR).position == 0


@pytest.mark.parametrize(
    ("rules", "kw", "expected"),
    [(RR, {"rr_next": 1}, (1, 2)), (RR, {"rr_next": 2}, (2, 0)), (LEAST, {}, (1, 2))],
    ids=["round_robin from the cursor", "round_robin wraps", "least_loaded"],
)
def test_a_gang_takes_n_devices_that_fit_together(
    rules: Rules, kw: dict[str, Any], expected: tuple[int, ...]
) -> None:
    devices = [Device(0, 2, running=1), Device(1, 2), Device(2, 2)]
    decision = place(Job(gang=2), devices, rules, **kw)
    assert decision.positions == expected


def test_a_gang_holds_nothing_while_it_waits() -> None:
    """Two devices wanted, one free: the job is not placed at all (never one of the two)."""
    devices = [Device(0, 1, running=1), Device(1, 1)]
    decision = place(Job(gang=2, whole=True), devices, RR)
    assert decision.positions == () and "needs 2 devices free together" in decision.reason
    assert "1 of them fit now" in decision.reason


def test_admit_refuses_more_devices_than_the_host_has() -> None:
    refusal = admit("program", 0, None, two(), count=3)
    assert refusal is not None and refusal.code == "no_such_device"
    assert "needs 3 devices at once; this host has 2" in refusal.message
    assert admit("program", 0, None, two(), count=2) is None
