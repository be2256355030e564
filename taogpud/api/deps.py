"""How a handler reaches the daemon: one dependency, one object (and the metrics registry).
Both are read from app.state, where create_app put what the composition step built
(daemon/compose.py)."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, Request
from prometheus_client import CollectorRegistry

from taogpud.daemon.state import DaemonState


async def daemon_state(request: Request) -> DaemonState:
    # async on purpose: FastAPI runs a sync dependency in a thread pool, a thread hop per request.
    state: DaemonState = request.app.state.daemon
    return state


async def metrics_registry(request: Request) -> CollectorRegistry:
    registry: CollectorRegistry = request.app.state.metrics
    return registry


Daemon = Annotated[DaemonState, Depends(daemon_state)]
Metrics = Annotated[CollectorRegistry, Depends(metrics_registry)]
