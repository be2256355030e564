"""Config: the effective pair (redacted) and the last reload's outcome."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from taogpud.api.deps import Daemon
from taogpud.api.models import ConfigStatusView, ReloadView
from taogpud.daemon.state import Phase
from taogpud.errors import Draining

router = APIRouter(prefix="/v1/config", tags=["config"])


@router.get("")
async def effective_config(daemon: Daemon) -> dict[str, Any]:
    return daemon.status.snapshot.redacted()


@router.get("/status", response_model=ConfigStatusView)
async def config_status(daemon: Daemon) -> ConfigStatusView:
    status = daemon.status
    return ConfigStatusView(
        generation=status.generation, digest=status.snapshot.digest, last_reload=status.last_reload
    )


@router.post("/reload", response_model=ReloadView)
async def reload_config(daemon: Daemon) -> ReloadView:
    """Re-read both files; valid → swapped (workers rolled if needed), invalid → old kept."""
    if daemon.status.phase is not Phase.ready:
        raise Draining(
            f"taogpud is {daemon.status.phase}; it reloads only when ready", "try again shortly"
        )
    return await daemon.reload("api")
