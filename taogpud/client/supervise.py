"""The supervisor `taogpuctl exec --detach` leaves behind: a process of the user's own, in a
session of its own, that queues the program, says its job id on stdout (taogpuctl prints it
and exits), then waits for the lease, runs the program and sends its output to the daemon
as the job's log (`taogpuctl logs ID -f`). Its argument is one JSON document:
{"socket": PATH, "argv": [...], "request": {submit_program's keywords}}.

A supervisor killed -9 leaves its program running under its lease (docs/programs.md).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
from typing import Any

from taogpud.client import Client
from taogpud.client.program import ProgramRun, forwarding
from taogpud.errors import ApiError, DaemonUnreachable

EXIT_REFUSED = 2


class LogShipper:
    """Sends the program's output to the daemon, on the reader thread's own connection."""

    def __init__(self, socket_path: str) -> None:
        self.socket_path = socket_path
        self.job_id = ""
        self._local = threading.local()

    def __call__(self, piece: bytes) -> None:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = Client(self.socket_path)
        with contextlib.suppress(ApiError, DaemonUnreachable):  # the program runs on regardless
            client.append_program_log(self.job_id, piece)


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[0])
    shipper = LogShipper(spec["socket"])

    with Client(spec["socket"]) as client:
        run = ProgramRun(
            client, spec["argv"], reap_descendants=True, on_output=shipper, **spec["request"]
        )
        try:
            with forwarding(run):
                job = run.submit()
                shipper.job_id = job["id"]
                _say({"job": job})
                return run.follow(job).exit_status
        except (ApiError, DaemonUnreachable) as exc:
            if run.job is None:  # refused: taogpuctl says why
                _say({"error": {"message": str(exc.message), "hint": getattr(exc, "hint", "")}})
                return EXIT_REFUSED
            raise
        except KeyboardInterrupt:  # told to stop before the program started
            if run.job is not None:
                client.cancel(run.job["id"])
            return 130


def _say(document: dict[str, Any]) -> None:
    """One line to taogpuctl, then stdout is closed: nothing else is its."""
    sys.stdout.write(json.dumps(document) + "\n")
    sys.stdout.flush()
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
