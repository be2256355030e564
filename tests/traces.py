"""Reading the daemon's job traces: shared by the tests and scripts/soak.py."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

FINISHED_EVENTS = {
    "job.succeeded",
    "job.failed",
    "job.cancelled",
    "job.timed_out",
    "job.interrupted",
}


def most_running(events: Iterable[dict[str, Any]]) -> int:
    """The most jobs running at once, by job id: a job leaves at any finished event."""
    running: set[str] = set()
    most = 0
    for event in events:
        if event.get("event") == "job.running":
            running.add(event["job_id"])
            most = max(most, len(running))
        elif event.get("event") in FINISHED_EVENTS:
            running.discard(event.get("job_id", ""))
    return most
