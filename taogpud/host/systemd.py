"""The systemd glue: tiny, and a no-op outside systemd (no NOTIFY_SOCKET, no LISTEN_FDS).

- `Notifier`: READY, RELOADING (with MONOTONIC_USEC), STATUS, STOPPING and WATCHDOG,
  each one datagram to $NOTIFY_SOCKET (sd_notify(3)'s protocol). Not sdnotify: that
  package reads only os.environ, encodes Latin-1 and drops what it cannot encode, and
  hides every error behind a bare `except:` (leaking its socket when NOTIFY_SOCKET is
  unusable). STATUS= is kept to one ASCII line. NOTIFY_SOCKET, WATCHDOG_USEC and
  WATCHDOG_PID leave the environment at start, so spawned workers can never speak
  for the daemon.
- `heartbeat`: the loop tick that keeps STATUS= current and sends WATCHDOG=1 only
  while the loop runs *and* the workers answer; a wedged daemon is then killed and
  restarted by systemd (WatchdogSec=).
- `listen_socket`: the Unix socket systemd passed (socket activation).
"""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import Awaitable, Callable, MutableMapping

SD_LISTEN_FDS_START = 3
STATUS_TICK_S = 1.0  # how often STATUS= is refreshed (sent only when it changed)
SEND_TIMEOUT_S = 2.0  # systemd reads its notify socket at once; never hang the loop long


class Notifier:
    def __init__(self, environ: MutableMapping[str, str] | None = None) -> None:
        env = os.environ if environ is None else environ
        address = env.get("NOTIFY_SOCKET", "")
        # "@name" is an abstract socket: a NUL byte, then the name.
        self._address = "\0" + address[1:] if address.startswith("@") else address
        self.enabled = address.startswith(("/", "@"))
        self.watchdog_s = _watchdog_s(env) if self.enabled else None
        self._sock: socket.socket | None = None
        if self.enabled:
            self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            self._sock.settimeout(SEND_TIMEOUT_S)
        self.last_status = ""
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            env.pop(name, None)

    def send(self, *assignments: str) -> bool:
        """One datagram of NAME=value lines. False if it could not be sent (as sd_notify,
        that is not an error the daemon can act on: systemd itself is gone or stuck)."""
        if self._sock is None:
            return False
        try:
            self._sock.sendto("\n".join(assignments).encode(), self._address)
        except OSError:
            return False
        return True

    def ready(self, status: str | None = None) -> None:
        """READY=1: at start once every worker is warm, and at the end of a reload."""
        self.send("READY=1", self._status(status))

    def reloading(self, status: str = "reloading configuration") -> None:
        """RELOADING=1 with the CLOCK_MONOTONIC time systemd needs to match it; READY=1 ends it."""
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        self.send("RELOADING=1", f"MONOTONIC_USEC={usec}", self._status(status))

    def status(self, status: str) -> None:
        self.send(self._status(status))

    def stopping(self, status: str) -> None:
        self.send("STOPPING=1", self._status(status))

    def watchdog(self) -> None:
        self.send("WATCHDOG=1")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    def _status(self, status: str | None) -> str:
        if status is not None:
            self.last_status = ascii_status(status)
        return f"STATUS={self.last_status}"


def ascii_status(text: str) -> str:
    return text.encode("ascii", "replace").decode("ascii").replace("\n", " ")


def _watchdog_s(env: MutableMapping[str, str]) -> float | None:
    """WatchdogSec= as seconds, when systemd armed the watchdog for this very process."""
    pid = env.get("WATCHDOG_PID")
    if pid and pid != str(os.getpid()):
        return None
    try:
        usec = int(env.get("WATCHDOG_USEC", ""))
    except ValueError:
        return None
    return usec / 1e6 if usec > 0 else None


async def heartbeat(
    notifier: Notifier,
    status: Callable[[], str],
    healthy: Callable[[float], Awaitable[bool]],
) -> None:
    """Refresh STATUS= when it changes; send WATCHDOG=1 each tick that `healthy` passes.

    `healthy(timeout_s)` answers within timeout_s. A tick runs at most every second and at
    least four times per watchdog period, so systemd kills the daemon only after a whole
    WatchdogSec with no healthy tick: a blocked loop sends nothing, and a loop whose
    workers stop answering withholds WATCHDOG=1.
    """
    if not notifier.enabled:
        return
    period_s = notifier.watchdog_s
    tick_s = min(STATUS_TICK_S, period_s / 4) if period_s else STATUS_TICK_S
    while True:
        started = time.monotonic()
        text = ascii_status(status())
        if text != notifier.last_status:
            notifier.status(text)
        if period_s and await healthy(period_s / 4):
            notifier.watchdog()
        await asyncio.sleep(max(0.0, tick_s - (time.monotonic() - started)))


def listen_socket(environ: MutableMapping[str, str] | None = None) -> socket.socket | None:
    """The Unix stream socket systemd passed (socket activation), if it passed one to us.

    LISTEN_FDS counts the descriptors from fd 3 and LISTEN_FDNAMES names them
    (FileDescriptorName=, by default the socket unit's name). The first AF_UNIX stream
    socket is served; any other passed descriptor is closed, systemd keeps its own copy.
    """
    env = os.environ if environ is None else environ
    if env.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = int(env.get("LISTEN_FDS", "0") or "0")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        env.pop(name, None)
    chosen: socket.socket | None = None
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # not a socket (ListenFIFO=, ...): not ours to serve
            os.close(fd)
            continue
        sock.set_inheritable(False)  # never into a worker
        if chosen is None and sock.family == socket.AF_UNIX and sock.type == socket.SOCK_STREAM:
            chosen = sock
        else:
            sock.close()
    return chosen
