"""The systemd glue: tiny, and a no-op outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS).

sdnotify encodes Latin-1 and silently drops a message it cannot encode, so
STATUS= text is reduced to ASCII here. NOTIFY_SOCKET is taken out of the
environment at start so spawned workers can never speak for the daemon.
"""

from __future__ import annotations

import os
import socket
import time

import sdnotify

SD_LISTEN_FDS_START = 3


class Notifier:
    def __init__(self) -> None:
        self.enabled = bool(os.environ.get("NOTIFY_SOCKET"))
        self._notifier = sdnotify.SystemdNotifier() if self.enabled else None
        os.environ.pop("NOTIFY_SOCKET", None)

    def send(self, *assignments: str) -> None:
        if self._notifier is not None:
            self._notifier.notify("\n".join(assignments))

    def ready(self, status: str) -> None:
        self.send("READY=1", f"STATUS={ascii_status(status)}")

    def status(self, status: str) -> None:
        self.send(f"STATUS={ascii_status(status)}")

    def reloading(self) -> None:
        """Type=notify reload protocol (systemd 253 reads MONOTONIC_USEC; 252 ignores it)."""
        monotonic_usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={monotonic_usec}")

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", f"STATUS={ascii_status(status)}")


def ascii_status(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii").replace("\n", " ")


def listen_socket() -> socket.socket | None:
    """The Unix socket systemd passed (socket activation), if it passed one to us."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    if int(os.environ.get("LISTEN_FDS", "0")) < 1:
        return None
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    return socket.socket(fileno=SD_LISTEN_FDS_START)
