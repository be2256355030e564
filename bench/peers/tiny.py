"""The tiny job every peer runs: nothing, like taogpud's `noop` task."""

from __future__ import annotations

import json

# The bytes of one taogpud submit, for the echo floor (the same bytes cross the socket).
SUBMIT_BODY = json.dumps({"task": "noop", "params": {}}).encode()
SUBMIT_REQUEST = (
    b"POST /v1/jobs?wait_s=30 HTTP/1.1\r\nhost: taogpud\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(SUBMIT_BODY)}\r\n\r\n".encode()
    + SUBMIT_BODY
)


def noop() -> None:
    return None
