"""Waiting on Ray from the daemon's event loop, never blocking it and never for ever."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, TypeVar

from ray.exceptions import GetTimeoutError

T = TypeVar("T")


async def wait_ref(ref: Any, timeout_s: float | None) -> Any:
    """An ObjectRef's value from the event loop (any loop, uvloop too), within timeout_s."""
    future = asyncio.wrap_future(ref.future())
    if timeout_s is None:
        return await future
    try:
        return await asyncio.wait_for(future, timeout_s)
    except GetTimeoutError:
        raise TimeoutError from None


async def in_daemon_thread(call: Callable[[], T], timeout_s: float | None) -> T:
    """call() in a daemon thread, awaited for at most timeout_s.

    Not asyncio.to_thread: a ray.init that never returns would keep the executor's thread,
    and the interpreter joins those at exit. A daemon thread is left behind instead."""
    done: Future[T] = Future()

    def target() -> None:
        try:
            done.set_result(call())
        except BaseException as exc:
            done.set_exception(exc)

    threading.Thread(target=target, name="taogpud-ray", daemon=True).start()
    async with asyncio.timeout(timeout_s):
        return await asyncio.wrap_future(done)


class KeeperThread:
    """ray.init in a daemon thread that then stays alive until released.

    A local instance's GCS and raylet die with the thread that started them (Ray sets
    PR_SET_PDEATHSIG, which follows the parent thread): that thread must outlive them. A
    daemon thread, not asyncio.to_thread: a ray.init that never returns is left behind at
    exit instead of being joined."""

    def __init__(self) -> None:
        self._released = threading.Event()

    async def start(self, call: Callable[[], object], timeout_s: float) -> None:
        done: Future[None] = Future()

        def target() -> None:
            try:
                call()
            except BaseException as exc:
                done.set_exception(exc)
                return
            done.set_result(None)
            self._released.wait()

        threading.Thread(target=target, name="taogpud-ray-init", daemon=True).start()
        async with asyncio.timeout(timeout_s):
            await asyncio.wrap_future(done)

    def release(self) -> None:
        self._released.set()


def first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
