"""The daemon's side of one worker process: spawn, its pipes, warm-up, stop, kill.

A worker has a control pipe (warm-up, ping, cancel, the memory cap, stop) and one pipe per
slot: a job goes down a free slot's pipe and its result comes back up the same one, so the
worker runs it on the thread that read it (child.Runner). The pipes are read from the event
loop (add_reader), not from a thread: a result reaches the scheduler without a thread hop.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import multiprocessing
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess

from taogpud.backends.base import DeviceInfo, WorkerSpec
from taogpud.host.environ import without_secrets
from taogpud.pool import protocol as msg
from taogpud.pool.child import worker_main
from taogpud.pool.interface import WorkerState

SPAWN = multiprocessing.get_context("spawn")
_ping_tokens = itertools.count(1)


class WorkerHandle:
    def __init__(
        self,
        spec: WorkerSpec,
        on_message: Callable[[WorkerHandle, msg.FromWorker], None],
        on_exit: Callable[[WorkerHandle], None],
    ) -> None:
        self.spec = spec
        self.state = WorkerState.dead
        self.info: DeviceInfo | None = None
        self.pid: int | None = None
        self.running: set[str] = set()  # job ids on this worker now
        self.reserved_bytes = 0  # memory estimates of those jobs (admission)
        self.jobs_done = 0
        self.restarts = 0  # respawns in all, for status
        self.crash_streak = 0  # respawns since it last stayed warm a while: the backoff
        self.warm_at: float | None = None  # time.monotonic() when it last reported warm
        self.warm_failure: str | None = None
        self.retired = False  # replaced by a reload: its exit is expected, not a crash
        self._on_message = on_message
        self._on_exit = on_exit
        self._process: BaseProcess | None = None
        self._conn: Connection | None = None  # the control pipe
        self._slots: list[Connection] = []  # one pipe per slot
        self._free: list[int] = []  # slots without a job, by index into _slots
        self._settled = asyncio.Event()  # set once warm or dead
        # The one ping in flight: its token, the pipe it went down, the answer.
        self._ping: tuple[int, Connection | None, asyncio.Future[None]] | None = None

    @property
    def label(self) -> str:
        return self.info.device if self.info else f"{self.spec.backend}:{self.spec.index}"

    @property
    def free_slots(self) -> int:
        if self.state is not WorkerState.warm:
            return 0
        return self.spec.stream_count - len(self.running)

    def start(self) -> None:
        parent_conn, child_conn = SPAWN.Pipe(duplex=True)
        slot_pipes = [SPAWN.Pipe(duplex=True) for _ in range(self.spec.stream_count)]
        process = SPAWN.Process(
            target=worker_main,
            args=(self.spec, child_conn, [theirs for _, theirs in slot_pipes]),
            name=f"taogpud-worker-{self.spec.backend}{self.spec.index}",
            daemon=True,
        )
        with without_secrets():  # nor its resource tracker, which the first start spawns
            process.start()
        for conn in (child_conn, *(theirs for _, theirs in slot_pipes)):
            conn.close()  # so our ends see EOF when the child dies
        self._process, self._conn, self.pid = process, parent_conn, process.pid
        self._slots = [ours for ours, _ in slot_pipes]
        self._free = list(range(len(self._slots)))
        self.state, self.info, self.warm_failure = WorkerState.starting, None, None
        self._settled.clear()
        loop = asyncio.get_running_loop()
        for number, conn in enumerate([parent_conn, *self._slots]):
            loop.add_reader(conn.fileno(), self._on_readable, conn, number - 1)

    async def wait_settled(self, timeout_s: float) -> None:
        async with asyncio.timeout(timeout_s):
            await self._settled.wait()

    def send(self, order: msg.ToWorker) -> None:
        """A job to a free slot's pipe; Stop to every pipe, after the jobs sent before it;
        anything else to the control pipe."""
        if self._conn is None:
            raise BrokenPipeError(f"worker {self.label} is not running")
        if isinstance(order, msg.RunJob):
            if not self._free:
                raise RuntimeError(f"worker {self.label} was sent a job with no slot free")
            msg.send(self._slots[self._free.pop()], order)
            return
        if isinstance(order, msg.Stop):
            for conn in self._slots:
                msg.send(conn, order)
        msg.send(self._conn, order)

    async def ping(self, timeout_s: float) -> bool:
        """Whether the worker answers a Ping within timeout_s (its pipe loop is alive).

        At most one ping is in flight: a worker that stopped reading its pipe is asked once,
        not until the pipe fills and a send blocks the daemon."""
        if self._ping is None or self._ping[1] is not self._conn:  # none, or to a process gone
            token = next(_ping_tokens)
            self._ping = (token, self._conn, asyncio.get_running_loop().create_future())
            try:
                self.send(msg.Ping(token))
            except OSError:
                self._ping = None
                return False
        pending = self._ping[2]
        try:
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(pending)
        except TimeoutError:
            return False
        return True

    def _pong(self, token: int) -> None:
        if self._ping is not None and self._ping[0] == token:
            self._ping[2].set_result(None)
            self._ping = None

    def kill(self) -> None:
        if self._process is not None and self._process.is_alive():
            self._process.kill()

    async def stop(self, timeout_s: float) -> None:
        """Ask the worker to finish its jobs and exit; kill it if it does not in time."""
        if self._process is None:
            return
        self.state = WorkerState.stopping
        with contextlib.suppress(OSError):  # already gone
            self.send(msg.Stop())
        process = self._process
        await asyncio.to_thread(process.join, timeout_s)
        if process.is_alive():
            process.kill()
            await asyncio.to_thread(process.join, 5)

    def _on_readable(self, conn: Connection, slot: int) -> None:
        """One message (the loop calls again while more is there); slot -1 is the control
        pipe. A slot's only message is its job's result: the slot is free again."""
        try:
            message = msg.receive(conn)
        except (EOFError, OSError):
            self._lost()
            return
        self._take(message, slot)

    def _take(self, message: msg.FromWorker, slot: int) -> None:
        if slot >= 0:
            self._free.append(slot)
        self._deliver(message)

    def _deliver(self, message: msg.FromWorker) -> None:
        if isinstance(message, msg.Warm):
            self.info, self.pid, self.state = message.info, message.pid, WorkerState.warm
            self.warm_at = time.monotonic()
            self._settled.set()
        elif isinstance(message, msg.InfoUpdated):
            self.info = message.info
        elif isinstance(message, msg.WarmFailed):
            self.warm_failure = message.reason
        elif isinstance(message, msg.Pong):
            self._pong(message.token)
        self._on_message(self, message)

    def _lost(self) -> None:
        self.state = WorkerState.dead  # before the drain: the scheduler places nothing here
        self._drain_results()
        if self._conn is not None:
            loop = asyncio.get_running_loop()
            for conn in [self._conn, *self._slots]:
                loop.remove_reader(conn.fileno())
                conn.close()
            self._conn, self._slots, self._free = None, [], []
        self._settled.set()
        if self._process is not None:
            self._process.join(timeout=1.0)  # reap; EOF means it is exiting now
        self._on_exit(self)

    def _drain_results(self) -> None:
        """Results a dying worker wrote before it went: the pipes are read in no set order,
        so the end of one can be seen while another still holds a job's last word (a device
        error's code, written just before the worker left on purpose)."""
        for slot, conn in enumerate(self._slots):
            try:
                while conn.poll():
                    self._take(msg.receive(conn), slot)
            except (EOFError, OSError):
                continue

    def exit_description(self) -> str:
        code = self._process.exitcode if self._process is not None else None
        if code is None:
            return "still running"
        if code < 0:
            return f"killed by signal {-code}"
        if code == msg.EXIT_DEVICE_UNUSABLE:
            return "exited after an unrecoverable device error (its last job says which)"
        return f"exit status {code}"
