"""A job id as a person gives one: the full id, or any prefix of it no other job id starts
with (as git and docker take one). taogpuctl and the MCP tools both resolve ids here.
"""

from __future__ import annotations

import re

from taogpud.client import Client
from taogpud.errors import AmbiguousId, ApiError

FULL_ID_LENGTH = 17  # jobs.new_job_id(): 6 random hex + 11 hex of milliseconds
_HEX = re.compile(r"^[0-9a-f]+$")


def resolve_id(client: Client, given: str) -> str:
    """The full job id for `given`: itself when the daemon knows it, else the one job whose id
    starts with it. Unknown → the daemon's job_not_found; several → AmbiguousId."""
    try:
        client.get(given)
    except ApiError as exc:
        if exc.code != "job_not_found" or not _could_be_prefix(given):
            raise
        matches = [str(job["id"]) for job in client.list_jobs(limit=10_000)]
        candidates = sorted(job_id for job_id in matches if job_id.startswith(given))
        if not candidates:
            raise
        if len(candidates) > 1:
            raise AmbiguousId(given, candidates) from None
        return candidates[0]
    return given


def _could_be_prefix(given: str) -> bool:
    return 0 < len(given) < FULL_ID_LENGTH and bool(_HEX.match(given))
