"""Reading the daemon's job traces: kept for the tests that import it from here; the helpers
live in taogpud.testing (the harness bench and scripts use too)."""

from taogpud.testing import FINISHED_EVENTS, most_running

__all__ = ["FINISHED_EVENTS", "most_running"]
