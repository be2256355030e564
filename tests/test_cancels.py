"""The cancel book a worker's threads share (pool/cancels.py)."""

from __future__ import annotations

from taogpud.pool.cancels import EARLY_KEPT, Cancels


def test_a_cancel_reaches_the_running_job() -> None:
    cancels = Cancels()
    flag = cancels.open("j1")
    assert not flag.is_set()
    cancels.cancel("j1")
    assert flag.is_set()


def test_a_cancel_that_came_before_its_job_starts_it_cancelled() -> None:
    """The control pipe and the slot's pipe are read by different threads: either may win."""
    cancels = Cancels()
    cancels.cancel("j1")
    assert cancels.open("j1").is_set()
    assert not cancels.open("j2").is_set()


def test_a_finished_job_is_not_cancelled_by_a_late_cancel_of_another() -> None:
    cancels = Cancels()
    cancels.open("j1")
    cancels.close("j1")
    cancels.cancel("j1")  # came after the job ended: remembered, harmless
    assert not cancels.open("j2").is_set()


def test_early_cancels_are_bounded() -> None:
    """Cancels of jobs that already ended are never claimed: only the newest are kept."""
    cancels = Cancels()
    for n in range(EARLY_KEPT + 10):
        cancels.cancel(f"gone{n}")
    assert not cancels.open("gone0").is_set()  # forgotten
    assert cancels.open(f"gone{EARLY_KEPT + 9}").is_set()
