"""Every door held to the same rules: the one connection policy of every listener the daemon
opens (the control socket, the `.shm` socket, the relay's TCP port, and any added later).

    policy.py   Doors (the registry every listener is opened through), Door, the caps per uid,
                for peers without a uid, and in all (ConnectionGuard)
    http.py     the HTTP doors: uvicorn's protocol class (`http=`) with head and body limits
                and timeouts, checked before the application reads a byte
    stream.py   doors with the daemon's own framing (`.shm`): accept with backoff, the caps,
                a deadline per connection
    noise.py    refusals counted and logged as summaries, one line per kind per interval
    serve.py    serve_http: the one way an HTTP listener is started (uvicorn on the loop,
                through its door) and stopped

A listener gets the policy by being opened through `Doors`: `http_protocol()` or
`stream_door()` register it (name, kind, address, socket inode) before it serves anyone, and
`GET /v1/status` lists what is registered; tests/test_doors.py finds every listening socket
the daemon holds in /proc and fails on one the registry does not know.
"""

from taogpud.doors.http import http_protocol
from taogpud.doors.policy import Door, Doors, Ticket
from taogpud.doors.serve import HttpListener, serve_http
from taogpud.doors.stream import Deadline, StreamDoor, stream_door

__all__ = [
    "Deadline",
    "Door",
    "Doors",
    "HttpListener",
    "StreamDoor",
    "Ticket",
    "http_protocol",
    "serve_http",
    "stream_door",
]
