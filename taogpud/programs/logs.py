"""A detached program's output, kept by the daemon as its log (docs/programs.md).

Its starter (the supervisor `taogpuctl exec --detach` leaves behind) sends the output in
pieces; each program's log is a file beside the job's kept outputs, so the store's pruning
takes it with the job. A log stops at its bound (scheduling.program_log_kb): what comes after
is dropped, and one line at the end says so.
"""

from __future__ import annotations

from pathlib import Path

LOG_NAME = "program.log"
READ_MAX_BYTES = 1 << 20  # one answer of GET /v1/programs/{id}/log


class ProgramLogs:
    def __init__(self, outputs_dir: Path) -> None:
        self.outputs_dir = outputs_dir

    def path(self, job_id: str) -> Path:
        return self.outputs_dir / job_id / LOG_NAME

    def size(self, job_id: str) -> int:
        try:
            return self.path(job_id).stat().st_size
        except FileNotFoundError:
            return 0

    def append(self, job_id: str, data: bytes, limit: int) -> int:
        """Append what fits under `limit`; the bytes kept (the rest is dropped, said once)."""
        path = self.path(job_id)
        path.parent.mkdir(parents=True, exist_ok=True)
        size = self.size(job_id)
        room = max(limit - size, 0)
        kept = data[:room]
        with path.open("ab") as log:
            log.write(kept)
            if len(kept) < len(data) and size <= limit:
                note = f"\n[taogpud: this log reached its bound of {limit} bytes "
                log.write((note + "(scheduling.program_log_kb); the rest is dropped]\n").encode())
        return len(kept)

    def read(self, job_id: str, offset: int) -> bytes:
        try:
            with self.path(job_id).open("rb") as log:
                log.seek(offset)
                return log.read(READ_MAX_BYTES)
        except FileNotFoundError:
            return b""
