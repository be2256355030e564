"""A door out of descriptors backs off, logs once and counts (doors/stream.py): the `.shm`
socket, woken again at once by a connection it could not take, wrote 2.3 million "too many
open files" lines in 25 s. Tried for real: a process serving a stream door fills its own
descriptor table (a low RLIMIT_NOFILE), clients connect, then descriptors are freed.
"""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

from taogpud.testing import new_home, remove_home

CLIENTS = 10
SERVER = r"""
import asyncio, json, os, resource, socket, sys
from taogpud.config import ServerSection
from taogpud.doors import Doors, stream_door

async def main():
    path = sys.argv[1]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(128)
    listener.setblocking(False)
    doors = Doors(ServerSection, 1 << 16)
    served = []
    stream_door(doors, "test", listener, path, lambda: 0,
                lambda conn, ticket: served.append(conn), lambda body: b"")
    resource.setrlimit(resource.RLIMIT_NOFILE, (256, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
    fillers = []
    try:
        while True:
            fillers.append(os.dup(0))
    except OSError:
        pass
    print("FULL", flush=True)
    sys.stdin.readline()  # the clients have connected
    await asyncio.sleep(1.5)  # accept fails meanwhile, backing off
    for fd in fillers:
        os.close(fd)
    while len(served) < int(sys.argv[2]):
        await asyncio.sleep(0.05)
    print("RESULT " + json.dumps({"served": len(served), "failed": doors.noise.totals}), flush=True)

asyncio.run(main())
"""


def test_a_door_out_of_descriptors_backs_off_and_says_so_once() -> None:
    """Connections that come while the process has no descriptor left are taken once some
    are free; the failed accepts in between are counted, in one log line, not one each."""
    home = new_home()
    try:
        path = home / "door.sock"
        server = subprocess.Popen(
            [sys.executable, "-c", SERVER, str(path), str(CLIENTS)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        assert server.stdin is not None and server.stdout is not None
        assert server.stdout.readline().strip() == "FULL"
        clients = [_connect(path) for _ in range(CLIENTS)]
        server.stdin.write("go\n")
        server.stdin.flush()
        output, _ = server.communicate(timeout=60)
        for client in clients:
            client.close()
    finally:
        remove_home(home)
    lines = output.splitlines()
    result = json.loads(next(line for line in lines if line.startswith("RESULT "))[7:])
    assert result["served"] == CLIENTS
    assert result["failed"]["door.accept_failed"] >= 1
    said = [line for line in lines if "door.accept_failed" in line and "RESULT" not in line]
    assert len(said) == 1, said  # the first, at once; the rest would be its summary, later


def _connect(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(str(path))
    return sock
