"""Every bad input gets a 4xx in the one error shape, through the daemon's real socket; and
precision is never changed without a word."""

from __future__ import annotations

import ast
import contextlib
import io
import json
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.lib.format as npy_format
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from taogpud.client import ApiError
from taogpud.testing import InProcessDaemon, RunningDaemon, start_daemon
from taogpud.wire import NPY_MAGIC


@pytest.fixture(scope="module")
def daemon() -> Iterator[RunningDaemon]:
    """One daemon for the module: bad inputs must leave it serving the next request anyway."""
    home = Path(tempfile.mkdtemp(prefix="tgd-", dir="/tmp"))
    running = start_daemon(home / "d0", None, None)
    yield running
    running.stop()
    shutil.rmtree(home, ignore_errors=True)


def raw_exchange(socket_path: Path, data: bytes, timeout_s: float = 10.0) -> tuple[int, Any]:
    """Send `data` (a whole request, `connection: close`), read the answer to its end: the
    status and the JSON body. A daemon may answer and close before it has all of `data`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout_s)
        sock.connect(str(socket_path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            sock.sendall(data)
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # closed on the rest of `data`
            while chunk := sock.recv(65536):
                answer += chunk
    head, _, body = answer.partition(b"\r\n\r\n")
    return int(head.split(b" ")[1]), json.loads(body)


def npy_with_header(text: str, data: bytes = b"") -> bytes:
    """A .npy v1 image whose header dict is `text`, as given (no check of it)."""
    body = text.encode("latin1")
    body += b" " * (63 - (10 + len(body)) % 64) + b"\n"
    return NPY_MAGIC + b"\x01\x00" + len(body).to_bytes(2, "little") + body + data


def upload_raw(socket_path: Path, npy: bytes) -> tuple[int, Any]:
    head = (
        b"POST /v1/arrays HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        b"content-type: application/octet-stream\r\ncontent-length: %d\r\n\r\n" % len(npy)
    )
    return raw_exchange(socket_path, head + npy)


def assert_error_shape(status: int, body: Any, expected_status: int, code: str) -> None:
    assert (status, body.get("code")) == (expected_status, code), body
    assert set(body) == {"code", "message", "hint"}


@pytest.mark.parametrize(
    "descr",
    ["'|O'", "'O'", "'<O'", "'O8'", "'object'", "[('a', '<f4'), ('b', '|O')]", "'<U4'"],
)
def test_object_and_non_numeric_dtypes_are_refused_at_upload(
    daemon: RunningDaemon, descr: str
) -> None:
    """Objects in every spelling (and strings, structures) are a 400 at upload, not a job
    that fails later. The body has the length its header says: only the dtype is wrong."""
    itemsize = np.dtype(ast.literal_eval(descr)).itemsize
    npy = npy_with_header(f"{{'descr': {descr}, 'fortran_order': False, 'shape': (1,), }}")
    status, body = upload_raw(daemon.socket_path, npy + b"\0" * itemsize)
    assert_error_shape(status, body, 400, "invalid_request")
    assert "plain num" in body["message"]


def test_a_descr_numpy_does_not_know_is_a_400(daemon: RunningDaemon) -> None:
    npy = npy_with_header("{'descr': '<q9zz', 'fortran_order': False, 'shape': (2,), }")
    status, body = upload_raw(daemon.socket_path, npy + b"\0" * 16)
    assert_error_shape(status, body, 400, "invalid_request")
    assert "'<q9zz'" in body["message"]


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ("'descr': '<f4', 'fortran_order': False, 'shape': '123'", "shape is not valid: '123'"),
        ("'descr': '<f4', 'fortran_order': False, 'shape': (2.9,)", "shape is not valid"),
        ("'descr': '<f4', 'fortran_order': False, 'shape': [2]", "shape is not valid: [2]"),
        ("'descr': '<f4', 'fortran_order': 0, 'shape': (2,)", "fortran_order is not a valid"),
        ("'descr': '<f4', 'fortran_order': False, 'shape': (2,), 'x': 1", "correct keys"),
        ("'descr': '<f4', 'shape': (2,)", "correct keys"),
        ("'descr': 4, 'fortran_order': False, 'shape': (2,)", "descr is not a valid dtype"),
    ],
)
def test_a_header_numpy_refuses_is_a_400_naming_the_problem(
    daemon: RunningDaemon, fields: str, problem: str
) -> None:
    """numpy's own reader decides what a valid header is: one it refuses to load is refused
    with its reason, never reinterpreted (shape '123' was taken as (1, 2, 3), (2.9,) as (2,))."""
    npy = npy_with_header("{" + fields + ", }", bytes(24))
    with pytest.raises(ValueError, match=problem.split(":", maxsplit=1)[0]):
        np.load(io.BytesIO(npy))  # numpy itself refuses it, for this reason
    status, body = upload_raw(daemon.socket_path, npy)
    assert_error_shape(status, body, 400, "invalid_request")
    assert problem in body["message"]


def test_a_version_2_and_a_version_3_header_are_taken_as_numpy_writes_them(
    daemon: RunningDaemon,
) -> None:
    """The wider header length of .npy 2.0 and 3.0 (numpy writes them for large headers)."""
    array = np.arange(6, dtype=">i2").reshape(2, 3)
    out = io.BytesIO()
    npy_format.write_array_header_2_0(out, npy_format.header_data_from_array_1_0(array))
    for version in (2, 3):  # 3.0 differs only in its encoding (utf-8), and has no writer
        npy = out.getvalue()[:6] + bytes([version]) + out.getvalue()[7:] + array.tobytes()
        status, body = upload_raw(daemon.socket_path, npy)
        assert status == 201, body
        assert (body["shape"], body["dtype"]) == ([2, 3], ">i2")


def test_a_header_that_exhausts_the_parser_is_a_400(daemon: RunningDaemon) -> None:
    """Thousands of unary minus signs: RecursionError in the parser, answered as bad input."""
    shape = "-" * 20_000 + "1"
    npy = npy_with_header(f"{{'descr': '<f4', 'fortran_order': False, 'shape': ({shape},), }}")
    npy = NPY_MAGIC + b"\x02\x00" + (len(npy) - 10).to_bytes(4, "little") + npy[10:]
    status, body = upload_raw(daemon.socket_path, npy)
    assert_error_shape(status, body, 400, "invalid_request")
    with daemon.client() as client:
        assert client.health()["ok"]


def test_a_chunked_body_over_the_limit_is_a_413(daemon: RunningDaemon) -> None:
    """No Content-Length to refuse it by: the limit is counted as the chunks come."""
    piece = b"x" * 65536
    chunks = b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for _ in range(20))  # 1.25 MiB
    request = (
        b"POST /v1/jobs HTTP/1.1\r\nhost: x\r\nconnection: close\r\n"
        b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
        + chunks
        + b"0\r\n\r\n"
    )
    status, body = raw_exchange(daemon.socket_path, request)
    assert_error_shape(status, body, 413, "body_too_large")
    assert not [e for e in daemon.events() if e.get("level") == "error"]


def test_a_client_that_hangs_up_mid_upload_is_one_info_line(daemon: RunningDaemon) -> None:
    """Half a body, then the connection closes: one info line, no error and no traceback."""
    npy = npy_with_header("{'descr': '<f4', 'fortran_order': False, 'shape': (1048576,), }")
    head = (
        b"POST /v1/arrays HTTP/1.1\r\nhost: x\r\ncontent-type: application/octet-stream\r\n"
        b"content-length: %d\r\n\r\n" % (len(npy) + 4 * 1048576)
    )
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(daemon.socket_path))
        sock.sendall(head + npy + b"\0" * 100_000)
        time.sleep(0.3)
    gone = daemon.wait_for_event(lambda e: e.get("event") == "api.client_gone", timeout_s=10)
    assert gone["level"] == "info" and gone["path"] == "/v1/arrays"
    time.sleep(0.3)
    assert [e for e in daemon.events() if e.get("event") == "api.client_gone"] == [gone]
    assert not [
        e for e in daemon.events("api.request") if e["path"] == "/v1/arrays" and e["status"] == 499
    ]
    assert not [e for e in daemon.events() if e.get("level") in ("error", "critical")]
    assert "Traceback" not in daemon.stderr()


@pytest.mark.parametrize(("dtype", "task"), [(np.float64, "matmul"), (np.int32, "vector_add")])
def test_an_input_of_another_dtype_is_refused_naming_both(
    daemon: RunningDaemon, dtype: Any, task: str
) -> None:
    """float64 or int32 into a float32 job: refused (422) naming both dtypes, never computed
    in float32 without a word; with dtype=float64 a float64 input runs in float64."""
    inputs = ("a", "b")
    array = np.ones((4, 4), dtype=dtype)
    with daemon.client() as client:
        ids = {name: client.upload_array(array)["id"] for name in inputs}
        with pytest.raises(ApiError) as refused:
            client.submit(task, inputs=ids)
        assert (refused.value.http_status, refused.value.code) == (422, "invalid_params")
        assert str(np.dtype(dtype)) in refused.value.message
        assert "float32" in refused.value.message
        if dtype is np.float64:
            job = client.run(task, {"dtype": "float64"}, inputs=ids)
            assert job["status"] == "succeeded" and job["result"]["dtype"] == "float64"


DESCRS = st.one_of(
    st.sampled_from(["<f4", "<f8", "|b1", ">i2", "<c8", "|O", "O8", "<U3", "|V4", "<M8[s]"]),
    st.text(st.characters(max_codepoint=255), max_size=12),  # a header is latin-1
)
SHAPES = st.lists(
    st.one_of(st.integers(-3, 5), st.sampled_from([2**31, 2**63, 10**30])), max_size=4
)


@settings(max_examples=60, deadline=None, database=None, suppress_health_check=list(HealthCheck))
@given(descr=DESCRS, shape=SHAPES, fortran=st.booleans(), extra=st.integers(-8, 8))
def test_generated_npy_headers_never_get_a_server_error(
    daemon: RunningDaemon, descr: str, shape: list[int], fortran: bool, extra: int
) -> None:
    """Size and header edge cases schemathesis cannot write into a binary body: any descr,
    negative, zero and huge dimensions, a body a little short or long. Each answer is a 201
    or a 4xx in the one error shape, never a 5xx."""
    shape_text = "(" + "".join(f"{n}," for n in shape) + ")"
    header = f"{{'descr': {descr!r}, 'fortran_order': {fortran}, 'shape': {shape_text}, }}"
    try:
        nbytes = int(np.prod(shape, dtype=object)) * np.dtype(descr).itemsize
    except (TypeError, ValueError, SyntaxError, KeyError, OverflowError):
        nbytes = 16  # numpy does not know it: the daemon must say so
    data = bytes(max(0, min(nbytes, 4096) + extra))
    status, body = upload_raw(daemon.socket_path, npy_with_header(header, data))
    assert status < 500, body
    if status >= 400:
        assert set(body) == {"code", "message", "hint"}, body


def test_an_array_past_the_whole_quota_is_the_requests_fault(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """An upload bigger than a user's whole quota never fits, however long it waits: 413
    array_too_large naming the quota, not the 507 of a store that is full for now."""
    daemon = inprocess_factory(config={"memory": {"upload_quota_mb": 1}})
    header = "{'descr': '<f4', 'fortran_order': False, 'shape': (1048576,), }"
    status, body = upload_raw(daemon.socket_path, npy_with_header(header, bytes(4096)))
    assert (status, body["code"]) == (413, "array_too_large"), body
    assert "upload quota of 1048576 bytes" in body["message"]
    assert "memory.upload_quota_mb" in body["hint"]
