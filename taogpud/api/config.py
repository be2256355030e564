"""Config: the effective pair (redacted) and the last reload's outcome."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.models import ConfigStatusView, ReloadModel
from taogpud.daemon.state import Phase
from taogpud.errors import Draining

router = APIRouter(tags=["config"])


@router.get(wire.CONFIG.path)
async def effective_config(daemon: Daemon) -> dict[str, Any]:
    return daemon.status.snapshot.redacted()


@router.get(wire.CONFIG_STATUS.path, response_model=ConfigStatusView)
async def config_status(daemon: Daemon) -> ConfigStatusView:
    status = daemon.status
    return ConfigStatusView(
        generation=status.generation,
        digest=status.snapshot.digest,
        last_reload=ReloadModel.of(status.last_reload),
    )


@router.post(wire.RELOAD_CONFIG.path, response_model=ReloadModel)
async def reload_config(daemon: Daemon) -> ReloadModel:
    """Re-read both files; valid → swapped (workers rolled if needed), invalid → old kept."""
    if daemon.status.phase is not Phase.ready:
        raise Draining(
            f"taogpud is {daemon.status.phase}; it reloads only when ready", "try again shortly"
        )
    return ReloadModel.of(await daemon.reload("api"))
