"""How a handler reaches the daemon: one dependency, one object."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request

from taogpud.state import DaemonState


def daemon_state(request: Request) -> DaemonState:
    state: DaemonState = request.app.state.daemon
    return state


Daemon = Annotated[DaemonState, Depends(daemon_state)]
