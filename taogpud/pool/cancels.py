"""The cancel flags of the jobs a worker holds, shared by its threads.

A cancel comes on another thread than its job (the control pipe, Ray's control group), so it
can arrive before the job's thread has read the job: it is then remembered, and the job
starts cancelled. A cancel for a job that has already finished is remembered too, and
forgotten once EARLY_KEPT later ones have come.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

EARLY_KEPT = 1024


class Cancels:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._events: dict[str, threading.Event] = {}
        self._early: OrderedDict[str, None] = OrderedDict()

    def open(self, job_id: str) -> threading.Event:
        """The flag a starting job watches: already set when its cancel came first."""
        event = threading.Event()
        with self._lock:
            if self._early.pop(job_id, True) is None:
                event.set()
            self._events[job_id] = event
        return event

    def close(self, job_id: str) -> None:
        with self._lock:
            self._events.pop(job_id, None)

    def cancel(self, job_id: str) -> None:
        with self._lock:
            event = self._events.get(job_id)
            if event is not None:
                event.set()
                return
            self._early[job_id] = None
            if len(self._early) > EARLY_KEPT:
                self._early.popitem(last=False)
