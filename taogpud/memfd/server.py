"""The shared-memory socket: local clients hand the daemon their own memfd, once per
connection, and submit jobs whose arrays are regions of it (docs/shared-memory.md).

Owned end to end on the standard library (socket.recv_fds, fcntl seals, /proc): the HTTP
server is not involved. The daemon never maps a client's memory: it vets the descriptor (a
memfd, sealed against shrinking and growing so a worker can never fault past its end),
holds it while a connection or a job needs it, and names it to the worker, which maps the
job's regions itself (pool/regions.py). The memory counts against its owner: its pages are
charged to the client that allocated them (a region past the bytes it allocated is refused,
or the worker would allocate them, charged to the service), and each uid may hold at most
`quota_bytes` of memory here at once.

The socket is a door like the others (taogpud/doors): opened through the registry, its
connections held to the same caps per uid and in all, accepted with backoff when the daemon
is out of descriptors; a message's length (its head) is checked before its bytes are read,
the first message must come within `server.head_timeout_s` of the connection, and one begun
must be whole within `server.body_timeout_s`.
"""

from __future__ import annotations

import asyncio
import fcntl
import functools
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

from taogpud.doors import Deadline, Doors, StreamDoor, Ticket, stream_door
from taogpud.errors import (
    ErrorBody,
    MemoryQuota,
    NotMemfd,
    NotSealed,
    RegionMismatch,
    RegionNotAllocated,
    RegionOutside,
    RequestError,
    TaogpudError,
    TooManyInFlight,
)
from taogpud.host.unix_socket import bind_unix_socket
from taogpud.jobs.memory import JobRegions
from taogpud.jobs.records import Peer
from taogpud.jobs.scheduler import Scheduler
from taogpud.jobs.store import JobStore
from taogpud.memfd import protocol
from taogpud.memfd.regions import MemoryHandle, RegionRef
from taogpud.observability.logging import get_logger
from taogpud.wire import JobRequest

# A submit's fields → the request the scheduler takes, or a RequestError: the API's validation
# (api/models.py job_request_from), handed in by the daemon so that this module needs no API.
ParseRequest = Callable[[dict[str, Any]], JobRequest]

log = get_logger("taogpud.shm")

SIZE_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW
FROZEN_SEALS = SIZE_SEALS | fcntl.F_SEAL_WRITE
F_SEAL_FUTURE_WRITE = 0x10  # Linux 5.1; not in Python 3.11's fcntl
MAX_DIMS = 32
DEFAULT_MEMORIES_PER_UID = 64  # descriptors one uid may have the daemon hold


class Memory:
    """A client's memfd the daemon holds: closed when neither a connection nor a job needs it."""

    def __init__(self, fd: int, handle: MemoryHandle, uid: int, on_close: Callable[[], None]):
        self.fd, self.handle, self.uid = fd, handle, uid
        self._refs = 1
        self._on_close = on_close

    def hold(self) -> None:
        self._refs += 1

    def drop(self) -> None:
        self._refs -= 1
        if self._refs == 0:
            os.close(self.fd)
            self._on_close()


def vet_memfd(fd: int, frozen: bool) -> tuple[int, int, int, bool]:
    """(device, inode, size, writable) of a client's descriptor, or why it is refused."""
    try:
        target = str(Path(f"/proc/self/fd/{fd}").readlink())
    except OSError:
        target = ""
    try:
        seals = fcntl.fcntl(fd, fcntl.F_GET_SEALS)  # EINVAL unless shmem (memfd, tmpfs)
    except OSError:
        seals = -1
    if not target.startswith("/memfd:") or seals < 0:
        raise NotMemfd(
            f"the descriptor is not a memfd (it is {target or 'unknown'})",
            "create the memory with os.memfd_create(name, os.MFD_ALLOW_SEALING)",
        )
    needed = FROZEN_SEALS if frozen else SIZE_SEALS
    if seals & needed != needed:
        what = "F_SEAL_WRITE|F_SEAL_SHRINK|F_SEAL_GROW" if frozen else "F_SEAL_SHRINK|F_SEAL_GROW"
        raise NotSealed(
            f"the memfd is not sealed with {what} (its seals are {seals:#x})",
            f"fcntl(fd, F_ADD_SEALS, {what}) before handing it over"
            + (": a frozen input must be write-sealed" if frozen else ""),
        )
    stat = os.fstat(fd)
    if stat.st_size == 0:
        raise RequestError("the memfd is empty", "ftruncate it to its size before sealing it")
    writable = not seals & (fcntl.F_SEAL_WRITE | F_SEAL_FUTURE_WRITE)
    return stat.st_dev, stat.st_ino, stat.st_size, writable


def parse_region(spec: Any, memory: Memory, what: str) -> RegionRef:
    """An input region as the client described it, checked against the memory's size."""
    import numpy as np

    if not isinstance(spec, dict):
        raise RequestError(f"{what}: a region is an object", '{"offset", "shape", "dtype"}')
    offset: Any = spec.get("offset")
    shape: Any = spec.get("shape")
    if not _is_count(offset) or not isinstance(shape, list) or len(shape) > MAX_DIMS:
        raise RequestError(f"{what}: offset and shape must be counts", "offset ≥ 0, shape [n, …]")
    if not all(_is_count(n) for n in shape):
        raise RequestError(f"{what}: shape must be non-negative integers", "shape [n, …]")
    try:
        dtype = np.dtype(spec.get("dtype"))
    except TypeError:
        raise RegionMismatch(
            f"{what}: {spec.get('dtype')!r} is not a dtype", "e.g. '<f4'"
        ) from None
    if dtype.kind not in "biufc" or dtype.hasobject:
        raise RegionMismatch(f"{what}: dtype {dtype} is not a plain number", "int, float, complex")
    nbytes = math.prod(shape) * dtype.itemsize
    if spec.get("nbytes", nbytes) != nbytes:
        raise RegionMismatch(
            f"{what}: {spec['nbytes']} bytes disagree with shape {shape} of {dtype.str} "
            f"({nbytes} bytes)",
            "send the shape, dtype and size of the same array",
        )
    return RegionRef(
        memory.handle, offset, tuple(shape), dtype.str, _inside(offset, nbytes, memory, what)
    )


def _inside(offset: int, nbytes: int, memory: Memory, what: str) -> int:
    if offset + nbytes > memory.handle.size:
        raise RegionOutside(
            f"{what}: bytes {offset}..{offset + nbytes} lie outside the memory of "
            f"{memory.handle.size} bytes",
            "regions must lie inside the memfd handed over",
        )
    if nbytes:
        _allocated(offset, offset + nbytes, memory, what)
    return nbytes


def _allocated(offset: int, end: int, memory: Memory, what: str) -> None:
    """A region ends within the bytes its memory has allocated (fstat's st_blocks: one call,
    whatever the size), so a worker does not allocate the client's pages on first touch,
    charged to the service. Our Client allocates from the start of its memory, as it hands
    out space, so for it the count is exact; a client that allocates elsewhere than it names
    can still leave holes, at most as many bytes as it allocated itself (see the docs)."""
    allocated = os.fstat(memory.fd).st_blocks * 512
    if end > allocated:
        raise RegionNotAllocated(
            f"{what}: bytes {offset}..{end} lie past the {allocated} bytes your memory has "
            "allocated; a worker touching them would allocate them, charged to the service, "
            "not to you",
            "allocate the memory's pages before naming them (os.posix_fallocate, or write "
            "them); taogpud.client's Client does so as it hands out space",
        )


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class ShmServer:
    """Listens beside the HTTP socket; one _Connection per client."""

    def __init__(
        self,
        scheduler: Scheduler,
        store: JobStore,
        quota_bytes: int,
        parse_request: ParseRequest,
        memories_per_uid: int = DEFAULT_MEMORIES_PER_UID,
    ) -> None:
        self.scheduler, self.store = scheduler, store
        self.parse_request = parse_request
        self.quota_bytes, self.memories_per_uid = quota_bytes, memories_per_uid
        self.held: dict[int, tuple[int, int]] = {}  # uid → (bytes, memories) held now
        self.connections: set[_Connection] = set()
        self._door: StreamDoor | None = None
        self.doors: Doors | None = None
        self.path: Path | None = None

    def start(self, path: Path, doors: Doors) -> None:
        self.path, self.doors = path, doors
        self._door = stream_door(
            doors,
            "shm",
            bind_unix_socket(path),
            str(path),
            lambda: protocol.MAX_MESSAGE_BYTES,
            self._connected,
            _refusal,
        )

    def close(self) -> None:
        if self._door is not None:
            self._door.close()
            self._door = None
        for connection in list(self.connections):
            connection.close()
        if self.path is not None:
            self.path.unlink(missing_ok=True)

    def _connected(self, sock: socket.socket, ticket: Ticket) -> None:
        self.connections.add(_Connection(self, sock, ticket))

    def adopt(self, fd: int, uid: int, frozen: bool) -> Memory:
        """Vet a client's descriptor and count it against its uid; closes it if refused."""
        try:
            dev, ino, size, writable = vet_memfd(fd, frozen)
            held_bytes, held_count = self.held.get(uid, (0, 0))
            if held_bytes + size > self.quota_bytes or held_count >= self.memories_per_uid:
                raise MemoryQuota(
                    f"uid {uid} would hold {held_bytes + size} bytes in {held_count + 1} "
                    f"memories here; the quota is {self.quota_bytes} bytes, "
                    f"{self.memories_per_uid} memories",
                    "use a smaller memory, or close other connections first",
                )
        except BaseException:
            os.close(fd)
            raise
        self.held[uid] = (held_bytes + size, held_count + 1)
        handle = MemoryHandle(os.getpid(), fd, dev, ino, size, writable)
        return Memory(fd, handle, uid, lambda: self._released(uid, size))

    def _released(self, uid: int, size: int) -> None:
        held_bytes, held_count = self.held[uid]
        if held_count == 1:
            del self.held[uid]
        else:
            self.held[uid] = (held_bytes - size, held_count - 1)


class _Connection:
    """One client: its attached memory and up to protocol.MAX_IN_FLIGHT jobs at once, each
    answered when it ends, under the id its request gave."""

    def __init__(self, server: ShmServer, sock: socket.socket, ticket: Ticket) -> None:
        self.server, self.sock, self.ticket = server, sock, ticket
        self.peer = Peer.of(ticket.peer)  # the submitter of this connection's jobs
        sock.setblocking(False)
        self.deadline = Deadline(self._timed_out)
        self.deadline.arm(self._caps().head_timeout_s, "head_timeout")  # the first message
        self.memory: Memory | None = None
        # job id → (the request's id, the callback that answers it once the job ends)
        self.waiting: dict[str, tuple[Any, Callable[[], None]]] = {}
        self._in = bytearray()
        self._in_at = 0  # the stream offset of self._in's first byte
        self._received = 0  # bytes received in all
        # Descriptors by the stream offset of the last byte that came with them: the kernel
        # ends a read after a message that carries descriptors, so they are that message's.
        self._fds: list[tuple[int, list[int]]] = []
        self._out = bytearray()
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._readable)

    def _readable(self) -> None:
        try:
            data, fds, flags, _ = socket.recv_fds(
                self.sock, 1 << 16, protocol.MAX_FDS, socket.MSG_CMSG_CLOEXEC
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self.close()
            return
        self._received += len(data)
        if fds:
            self._fds.append((self._received - 1, fds))
        if not data or flags & socket.MSG_CTRUNC:
            self.close()  # hung up, or sent more descriptors than a message may carry
            return
        self._in += data
        while self.sock.fileno() >= 0 and (message := self._next_message()) is not None:
            self.deadline.cancel()
            self._handle(message, self._fds_before(self._in_at))
        if self._in and not self.deadline.armed and self.sock.fileno() >= 0:
            self.deadline.arm(self._caps().body_timeout_s, "body_timeout")  # a message begun

    def _caps(self) -> Any:
        assert self.server.doors is not None
        return self.server.doors.caps()

    def _timed_out(self, what: str) -> None:
        """The first message, or one begun, did not come whole in time: hang up."""
        if self.server.doors is not None:
            self.server.doors.noise.note("info", f"door.{what}", door="shm", uid=self.peer.uid)
        self.close()

    def _next_message(self) -> dict[str, Any] | None:
        before = len(self._in)
        try:
            message = protocol.take_message(self._in)
        except ValueError as exc:  # not our framing: say so once, then hang up
            self._reply({"error": RequestError(str(exc), "speak shm_wire").body().as_dict()})
            self.close()
            return None
        self._in_at += before - len(self._in)
        return message

    def _fds_before(self, end: int) -> list[int]:
        """The descriptors that came with the bytes before stream offset `end`."""
        taken = [fd for last, fds in self._fds if last < end for fd in fds]
        self._fds = [(last, fds) for last, fds in self._fds if last >= end]
        return taken

    def _handle(self, message: dict[str, Any], fds: list[int]) -> None:
        """One request; `fds` are the descriptors that came with it (each step pops the
        one it takes, and what is left is closed here)."""
        request_id = message.get("id")
        try:
            if not isinstance(request_id, int | str | None) or isinstance(request_id, bool):
                request_id = None
                raise RequestError("a request's id is a number or a string", '"id": 1')
            op = message.get("op")
            if op == "attach":
                self._attach(fds, request_id)
            elif op == "submit":
                self._submit(message, fds, request_id)
            else:
                raise RequestError(f"unknown op {op!r}", "ops: attach, submit")
        except TaogpudError as exc:
            self._reply({"error": exc.body().as_dict()}, request_id)
        except Exception as exc:  # a bug: logged, answered, and the daemon carries on
            log.exception("shm.request_failed", op=str(message.get("op")))
            body = TaogpudError(f"internal error: {type(exc).__name__}", "see the daemon's log")
            self._reply({"error": body.body().as_dict()}, request_id)
        finally:
            for fd in fds:
                os.close(fd)

    def _attach(self, fds: list[int], request_id: Any) -> None:
        if len(fds) != 1:
            raise RequestError("attach carries exactly one descriptor", "send_fds([memfd])")
        if self.memory is not None:
            raise RequestError("this connection already has its memory", "open another connection")
        fd = fds.pop()
        self.memory = self.server.adopt(fd, self._uid(), frozen=False)
        handle = self.memory.handle
        memory = {"size": handle.size, "writable": handle.writable}
        self._reply({"memory": memory, "max_in_flight": protocol.MAX_IN_FLIGHT}, request_id)

    def _submit(self, message: dict[str, Any], fds: list[int], request_id: Any) -> None:
        if len(self.waiting) >= protocol.MAX_IN_FLIGHT:
            raise TooManyInFlight(
                f"this connection has {len(self.waiting)} jobs in flight, the most it may have",
                "wait for an answer before submitting more, or open another connection",
            )
        sealed = bool(message.get("sealed"))
        if len(fds) != (1 if sealed else 0):
            raise RequestError("a sealed submit carries one descriptor, others none", "")
        held: list[Memory] = []
        try:
            source = self.server.adopt(fds.pop(), self._uid(), frozen=True) if sealed else None
            if source is not None:
                held.append(source)
            regions = self._regions(message, source or self._attached(), held)
            request = self.server.parse_request(_request_fields(message))
            job = self.server.scheduler.submit(request, self.peer, regions)
            self.server.scheduler.commit(job.id)  # stored before the client hears of it
        except BaseException:
            for memory in held:
                memory.drop()
            raise
        answer = lambda: self._answer(job.id, request_id)  # noqa: E731
        if self.server.store.when_finished(job.id, answer):
            self.waiting[job.id] = (request_id, answer)
        else:
            self._answer(job.id, request_id)

    def _regions(self, message: dict[str, Any], source: Memory, held: list[Memory]) -> JobRegions:
        """The job's regions; each memory it names is held (in `held`) until the job ends."""
        inputs = message.get("inputs") or {}
        if not isinstance(inputs, dict):
            raise RequestError("inputs: name → region", '{"a": {"offset", "shape", "dtype"}}')
        refs = {
            name: parse_region(spec, source, f"input {name!r}") for name, spec in inputs.items()
        }
        output = self._output(message.get("output"))
        if source is self.memory or output is not None:
            attached = self._attached()
            attached.hold()
            held.append(attached)
        handover = "shared" if source is self.memory else "sealed"
        return JobRegions(refs, output, handover, functools.partial(_drop_all, list(held)))

    def _output(self, spec: Any) -> RegionRef | None:
        if spec is None:
            return None
        memory = self._attached()
        if (
            not isinstance(spec, dict)
            or not _is_count(spec.get("offset"))
            or not _is_count(spec.get("nbytes"))
        ):
            raise RequestError("output: {offset, nbytes} in the attached memory", "")
        if not memory.handle.writable:
            raise NotSealed("the attached memory is write-sealed: outputs cannot go there", "")
        nbytes = _inside(spec["offset"], spec["nbytes"], memory, "output")
        return RegionRef(memory.handle, spec["offset"], (nbytes,), "|u1", nbytes)

    def _attached(self) -> Memory:
        if self.memory is None:
            raise RequestError("no memory attached to this connection", 'send {"op": "attach"}')
        return self.memory

    def _answer(self, job_id: str, request_id: Any) -> None:
        self.waiting.pop(job_id, None)
        job = self.server.store.get(job_id)
        if job is not None:
            self.server.store.tell(
                lambda: self._reply({"job": job.model_dump(mode="json")}, request_id)
            )

    def _uid(self) -> int:
        return self.peer.uid if self.peer.uid is not None else os.getuid()

    def _reply(self, message: dict[str, Any], request_id: Any = None) -> None:
        if self.sock.fileno() < 0:
            return
        if request_id is not None:
            message["id"] = request_id
        self._out += protocol.encode(message)
        self._flush()

    def _flush(self) -> None:
        try:
            sent = self.sock.send(self._out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self.close()
            return
        del self._out[:sent]
        if self._out:
            self._loop.add_writer(self.sock.fileno(), self._writable)

    def _writable(self) -> None:
        self._loop.remove_writer(self.sock.fileno())
        self._flush()

    def close(self) -> None:
        """The client left (or the daemon stops): its jobs run on and hold their memory."""
        if self.sock.fileno() < 0:
            return
        self.deadline.cancel()
        self.ticket.release()
        self._loop.remove_reader(self.sock.fileno())
        self._loop.remove_writer(self.sock.fileno())
        self.sock.close()
        self.server.connections.discard(self)
        for fd in self._fds_before(self._received + 1):
            os.close(fd)
        for job_id, (_, answer) in self.waiting.items():
            self.server.store.forget(job_id, answer)
        self.waiting = {}
        if self.memory is not None:
            self.memory.drop()
            self.memory = None


def _refusal(body: ErrorBody) -> bytes:
    """A connection over a cap hears why, in the socket's own framing, before it is closed."""
    return protocol.encode({"error": body.as_dict()})


def _drop_all(memories: list[Memory]) -> None:
    for memory in memories:
        memory.drop()


def _request_fields(message: dict[str, Any]) -> dict[str, Any]:
    """What a submit message may say of its job (its arrays are in inputs and output)."""
    return {
        k: message[k] for k in ("task", "params", "device", "priority", "timeout_s") if k in message
    }
