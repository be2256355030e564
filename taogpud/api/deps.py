"""How a handler reaches the daemon: one dependency, one object."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from taogpud.daemon.state import DaemonState


async def daemon_state(request: Request) -> DaemonState:
    # async on purpose: FastAPI runs a sync dependency in a thread pool, a thread hop per request.
    state: DaemonState = request.app.state.daemon
    return state


Daemon = Annotated[DaemonState, Depends(daemon_state)]
