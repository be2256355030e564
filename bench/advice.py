"""What to change, per group of the daemon's time: read beside that group's measured share."""

from __future__ import annotations

ADVICE: dict[str, str] = {}
