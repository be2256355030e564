"""numpy in, numpy out: jobs whose arrays live in this process's own shared memory.

    with Client() as client:
        a = client.empty((n,), "float32"); a[:] = ...      # allocated in the shared memory
        out = client.compute("vector_add", a=a, b=b)        # {"c": ndarray}; out.job the record

On this host the client creates one memfd (`os.memfd_create`), allocates its pages, seals
its size, maps it, and hands the descriptor to the daemon once per connection over
`<socket>.shm` (protocol.py); an array is then named by its offset, shape and dtype, and
the worker maps the same pages, so an array made with `empty()` costs no copy at all and
any other array one memcpy in. Outputs come back as ndarrays over the same memory. Where
descriptors cannot pass (no `.shm` socket: another host, an older daemon; a client whose
transport is not its Unix socket, such as a MockTransport) `compute` falls back to the HTTP
upload and download, through the client's transport.

A region a queued or running job uses is the client's to leave alone, as with registered
I/O buffers: `compute` waits for its job, so that is only a concern for other threads, or
for a `begin_compute` whose result is not in yet. With `frozen=True` the inputs are copied
into a one-shot memfd sealed against writes, and the job sees exactly what was sent.

Several jobs may be in flight on one connection (up to the daemon's `max_in_flight`):
`begin_compute` sends a request and returns at once, `compute` from several threads shares
the connection; each request carries an id and its answer is matched by it, whichever job
ends first. A thread that waits reads the socket for everyone (one reader at a time).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import itertools
import mmap
import os
import socket
import threading
import weakref
from typing import Any, Protocol

from taogpud.errors import job_failed, refusal
from taogpud.memfd import protocol
from taogpud.wire import ArrayJson, JobJson

Job = JobJson  # a job record as the daemon answers it

DEFAULT_SIZE = 1 << 30  # address space reserved; pages are allocated when handed out
ALIGN = 4096  # blocks start on a page: the worker maps from a page boundary
OUTPUT_ALIGN = 64  # pool/regions.py's output layout


class Outputs(dict[str, Any]):
    """A job's outputs by name, as ndarrays, with the job record as `.job`."""

    job: Job


class Arena:
    """A sealed-size memfd this process owns, mapped once, with a first-fit allocator.

    Thread-safe: blocks are handed out under a lock, and a release (an ndarray's finaliser,
    which the collector may run in any thread, even inside `allocate`) only queues the block;
    the next `allocate` takes the queue back into the free list."""

    def __init__(self, size: int) -> None:
        import numpy as np

        self.size = -(-size // ALIGN) * ALIGN
        self.fd = os.memfd_create("taogpud-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(self.fd, self.size)
        fcntl.fcntl(self.fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW)
        self.map = mmap.mmap(self.fd, self.size)
        self._bytes = np.frombuffer(self.map, np.uint8)
        self._base: int = self._bytes.__array_interface__["data"][0]
        self._free: list[tuple[int, int]] = [(0, self.size)]  # (offset, length), sorted
        self._released: collections.deque[tuple[int, int]] = collections.deque()
        self._lock = threading.Lock()
        # First fit carves from the lowest free bytes, so what was ever handed out is [0, mark)
        self._populated_to = 0

    def allocate(self, nbytes: int) -> int:
        """The offset of a new block of at least nbytes; MemoryError when none is free."""
        length = max(-(-nbytes // ALIGN) * ALIGN, ALIGN)
        with self._lock:
            self._take_back()
            for index, (offset, free) in enumerate(self._free):
                if free >= length:
                    self._free[index : index + 1] = (
                        [(offset + length, free - length)] if free > length else []
                    )
                    self._populate(offset, length)
                    return offset
        raise MemoryError(f"no free block of {nbytes} bytes in the {self.size}-byte shared memory")

    def release(self, offset: int, length: int) -> None:
        self._released.append((offset, length))  # atomic: no lock, so a finaliser never blocks

    def _take_back(self) -> None:
        """The released blocks back in the free list, merged with their neighbours."""
        if not self._released:
            return
        while self._released:
            self._free.append(self._released.popleft())
        self._free.sort()
        merged: list[tuple[int, int]] = []
        for start, free in self._free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1] = (merged[-1][0], merged[-1][1] + free)
            else:
                merged.append((start, free))
        self._free = merged

    def view(self, offset: int, shape: tuple[int, ...], dtype: Any) -> Any:
        """An ndarray over the bytes at offset (no copy)."""
        import numpy as np

        dtype = np.dtype(dtype)
        count = 1
        for n in shape:
            count *= n
        return self._bytes[offset : offset + count * dtype.itemsize].view(dtype).reshape(shape)

    def array(self, offset: int, shape: tuple[int, ...], dtype: Any, length: int) -> Any:
        """An ndarray over [offset, …): its block is released once it (and its views) is gone."""
        import numpy as np

        array = self.view(offset, shape, dtype).view(np.ndarray)  # its own finaliser
        weakref.finalize(array, self.release, offset, length)
        return array

    def offset_of(self, array: Any) -> int | None:
        """Where a C-contiguous array lies in this memory, or None when it lies elsewhere."""
        if not array.flags.c_contiguous:
            return None
        address: int = array.__array_interface__["data"][0]
        offset = address - self._base
        return offset if offset >= 0 and offset + array.nbytes <= self.size else None

    def _populate(self, offset: int, length: int) -> None:
        """Allocate the block's pages here, so they are charged to this process, not the
        daemon or its worker (posix_fallocate on a memfd: no page faults)."""
        end = offset + length
        if end > self._populated_to:
            os.posix_fallocate(self.fd, self._populated_to, end - self._populated_to)
            self._populated_to = end

    def close(self) -> None:
        with contextlib.suppress(BufferError):  # an ndarray over it still lives
            self.map.close()
        os.close(self.fd)


class Computation:
    """A job sent on the shared-memory connection: `result()` waits for its outputs."""

    def __init__(self, shared: SharedArrays | None, request_id: int, blocks: Any) -> None:
        self._shared, self._request_id, self._blocks = shared, request_id, blocks
        self._outputs: Outputs | None = None

    @classmethod
    def done(cls, outputs: Outputs) -> Computation:
        computation = cls(None, 0, [])
        computation._outputs = outputs
        return computation

    def result(self) -> Outputs:
        """The outputs as ndarrays (`.job` the record); ApiError if the job did not succeed."""
        if self._outputs is None:
            assert self._shared is not None
            shared, self._shared = self._shared, None
            self._outputs = shared.finish(self._request_id, self._blocks)
        return self._outputs


class OverHttp(Protocol):
    """What the fallback asks of the client over HTTP (taogpud.client.Client is one)."""

    def upload_array(self, array_or_npy_bytes: Any) -> ArrayJson: ...

    def run(
        self,
        task: str,
        params: dict[str, Any] | None = None,
        *,
        inputs: dict[str, str] | None = None,
        timeout_s: float | None = None,
        keep_outputs: bool = False,
    ) -> JobJson: ...

    def download_output(self, job_id: str, name: str) -> bytes: ...


class SharedArrays:
    """A client's shared memory and its connection to the daemon's `.shm` socket.

    `http_socket` is the daemon's HTTP socket, whose `.shm` socket sits beside it; None (a
    client whose transport is no Unix socket) leaves the HTTP fallback alone, through `client`.
    """

    def __init__(self, client: OverHttp, http_socket: str | None, size: int = DEFAULT_SIZE) -> None:
        self.client = client
        self._http_socket = http_socket
        self.sock: socket.socket | None = None
        self.arena: Arena | None = None
        self._size = size
        self._send_lock = threading.Lock()  # one message on the socket at a time
        self._ids = itertools.count(1)
        self._answers: dict[Any, dict[str, Any]] = {}  # request id → its answer, not yet taken
        self._answered = threading.Condition()
        self._reading = False  # a waiting thread reads the socket for all of them
        self._broken: Exception | None = None
        self._buffer = bytearray()  # bytes read past the last answer
        self._in_flight = threading.BoundedSemaphore(1)
        self._connect()

    def _connect(self) -> None:
        if self._http_socket is None:
            return  # no socket beside it to pass descriptors over: the HTTP body it is
        path = protocol.socket_path_for(self._http_socket)
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(path))
        except OSError:  # no fast path here: the HTTP body it is
            sock.close()
            return
        arena = Arena(self._size)
        protocol.send(sock, {"op": "attach"}, [arena.fd])
        attached = _answer(protocol.receive(sock, self._buffer))
        # an older daemon says nothing: one job at a time, as it allows
        self._in_flight = threading.BoundedSemaphore(int(attached.get("max_in_flight", 1)))
        self.sock, self.arena = sock, arena

    @property
    def local(self) -> bool:
        return self.sock is not None

    def empty(self, shape: tuple[int, ...] | int, dtype: Any = "float32") -> Any:
        """An uninitialised ndarray in the shared memory (plain numpy without the fast path)."""
        import numpy as np

        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        if self.arena is None:
            return np.empty(shape, dtype)
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        offset = self.arena.allocate(nbytes)
        return self.arena.array(offset, shape, dtype, max(-(-nbytes // ALIGN) * ALIGN, ALIGN))

    def compute(self, task: str, params: dict[str, Any] | None = None, **kwargs: Any) -> Outputs:
        """Run `task` on the arrays; its outputs as ndarrays (`.job`: the job record).

        The outputs get `out_bytes` of the shared memory (default: as much as the inputs
        take, at least 1 MiB); ApiError(bad_region) names the bytes they needed if more.
        A job that did not succeed raises ApiError with its error."""
        return self.begin_compute(task, params, **kwargs).result()

    def begin_compute(
        self,
        task: str,
        params: dict[str, Any] | None = None,
        *,
        frozen: bool = False,
        timeout_s: float | None = None,
        out_bytes: int | None = None,
        **arrays: Any,
    ) -> Computation:
        """Send the job and return at once (`.result()` waits for it); blocks only while the
        connection has the daemon's `max_in_flight` jobs waiting. Over HTTP it runs now.
        Take each result: until then its scratch and output space stay reserved."""
        import numpy as np

        inputs = {name: np.asarray(a) for name, a in arrays.items()}
        if self.sock is None or self.arena is None:
            return Computation.done(self._over_http(task, params or {}, inputs, timeout_s))
        message: dict[str, Any] = {"op": "submit", "task": task, "params": params or {}}
        if timeout_s is not None:
            message["timeout_s"] = timeout_s
        blocks: list[tuple[int, int]] = []  # scratch inputs, then the output span (last)
        fds: list[int] = []
        self._take_place()  # given back when its answer is read
        try:
            if frozen:
                message["inputs"], fd = _sealed_inputs(inputs)
                message["sealed"] = True
                fds.append(fd)
            else:
                message["inputs"] = self._place_inputs(inputs, blocks)
            wanted = out_bytes or max(sum(a.nbytes for a in inputs.values()), 1 << 20)
            out_length = -(-wanted // ALIGN) * ALIGN
            blocks.append((self.arena.allocate(out_length), out_length))
            message["output"] = {"offset": blocks[-1][0], "nbytes": out_length}
            message["id"] = request_id = next(self._ids)
            with self._send_lock:
                protocol.send(self.sock, message, fds)
        except BaseException:
            self._in_flight.release()
            self._release(blocks)
            raise
        finally:
            for fd in fds:
                os.close(fd)  # the daemon holds its own
        return Computation(self, request_id, blocks)

    def finish(self, request_id: int, blocks: list[tuple[int, int]]) -> Outputs:
        """The answer to a submit, as outputs; its scratch inputs freed."""
        try:
            job = _answer(self._await(request_id))["job"]
        except BaseException:
            self._release(blocks)
            raise
        self._release(blocks[:-1])
        return self._outputs(job, *blocks[-1])

    def _await(self, request_id: int) -> dict[str, Any]:
        """The answer with that id: read by this thread, or by another that waits too."""
        with self._answered:
            while request_id not in self._answers:
                self._step()
            return self._answers.pop(request_id)

    def _take_place(self) -> None:
        """A place in flight; while none is free, answers are read (by this thread or the
        one reading now) until one frees a place, so a lone thread never waits on itself."""
        with self._answered:
            while not self._in_flight.acquire(blocking=False):
                self._step()

    def _step(self) -> None:
        """With `_answered` held: read one answer off the socket, or wait while another
        thread reads one; raises once the connection broke."""
        if self._broken is not None:
            raise self._broken
        if self._reading:
            self._answered.wait()
            return
        self._reading = True
        self._answered.release()
        try:
            message = self._read_one()
        finally:
            self._answered.acquire()
            self._reading = False
            self._answered.notify_all()
        if message is not None:
            self._answers[message.get("id")] = message

    def _read_one(self) -> dict[str, Any] | None:
        """One answer off the socket (its job's place in flight given back), or None when
        the connection broke (then every waiter hears why)."""
        assert self.sock is not None
        try:
            message = protocol.receive(self.sock, self._buffer)
        except (ConnectionError, OSError, ValueError) as exc:
            self._broken = ConnectionError(f"the shared-memory connection broke: {exc}")
            return None
        if message.get("id") is not None:  # a submit's answer (attach's came before any)
            self._in_flight.release()
        return message

    def _release(self, blocks: list[tuple[int, int]]) -> None:
        assert self.arena is not None
        for offset, length in blocks:
            self.arena.release(offset, length)

    def _place_inputs(
        self, inputs: dict[str, Any], scratch: list[tuple[int, int]]
    ) -> dict[str, dict[str, Any]]:
        """Each input's region: where it already lies, or a copy into a scratch block."""
        assert self.arena is not None
        regions = {}
        for name, array in inputs.items():
            offset = self.arena.offset_of(array)
            if offset is None:
                offset = self.arena.allocate(array.nbytes)
                scratch.append((offset, max(-(-array.nbytes // ALIGN) * ALIGN, ALIGN)))
                self.arena.view(offset, array.shape, array.dtype)[...] = array
            regions[name] = _region(offset, array)
        return regions

    def _outputs(self, job: Job, out_offset: int, out_length: int) -> Outputs:
        """The outputs as ndarrays over the output span; the span's unused parts are freed."""
        assert self.arena is not None
        outputs = Outputs()
        outputs.job = job
        used = []
        if job.get("status") != "succeeded":
            self.arena.release(out_offset, out_length)
            raise job_failed(job)
        for output in job.get("outputs", []):
            offset, nbytes = output["offset"], output["nbytes"]
            if offset is None:  # not placed in this arena: no answer of this path
                raise job_failed(job)
            length = -(-nbytes // OUTPUT_ALIGN) * OUTPUT_ALIGN
            used.append((offset, length))
            shape = tuple(output["shape"])
            outputs[output["name"]] = self.arena.array(offset, shape, output["dtype"], length)
        cursor = out_offset
        for offset, length in sorted(used):
            if offset > cursor:
                self.arena.release(cursor, offset - cursor)
            cursor = offset + length
        if out_offset + out_length > cursor:
            self.arena.release(cursor, out_offset + out_length - cursor)
        return outputs

    def _over_http(
        self, task: str, params: dict[str, Any], inputs: dict[str, Any], timeout_s: float | None
    ) -> Outputs:
        """The fallback: upload each input, keep the outputs, download them."""
        import io

        import numpy as np

        ids = {name: self.client.upload_array(a)["id"] for name, a in inputs.items()}
        job = self.client.run(task, params, inputs=ids, keep_outputs=True, timeout_s=timeout_s)
        if job.get("status") != "succeeded":
            raise job_failed(job)
        outputs = Outputs()
        outputs.job = job
        for output in job.get("outputs", []):
            data = self.client.download_output(job["id"], output["name"])
            outputs[output["name"]] = np.load(io.BytesIO(data))
        return outputs

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.arena is not None:
            self.arena.close()
            self.arena = None


def _region(offset: int, array: Any) -> dict[str, Any]:
    return {"offset": offset, "shape": list(array.shape), "dtype": array.dtype.str}


def _sealed_inputs(inputs: dict[str, Any]) -> tuple[dict[str, dict[str, Any]], int]:
    """The inputs copied into a new memfd, then sealed against writes and resizing."""
    import numpy as np

    offsets, size = {}, 0
    for name, array in inputs.items():
        offsets[name] = size
        size += -(-array.nbytes // OUTPUT_ALIGN) * OUTPUT_ALIGN
    fd = os.memfd_create("taogpud-frozen", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, max(size, 1))
        with mmap.mmap(fd, max(size, 1)) as mapped:
            for name, array in inputs.items():
                flat = np.ascontiguousarray(array).reshape(-1)
                target = np.frombuffer(mapped, flat.dtype, flat.size, offsets[name])
                target[...] = flat
                del target  # F_SEAL_WRITE needs no writable mapping left
        seals = fcntl.F_SEAL_WRITE | fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, seals)
    except BaseException:
        os.close(fd)
        raise
    return {name: _region(offsets[name], a) for name, a in inputs.items()}, fd


def _answer(message: dict[str, Any]) -> dict[str, Any]:
    error = message.get("error")
    if error is not None:
        raise refusal(error)
    return message
