"""Config: the effective pair (redacted) and the last reload's outcome."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter

from taogpud.api.deps import Daemon
from taogpud.api.models import ConfigStatusView

router = APIRouter(prefix="/v1/config", tags=["config"])


@router.get("")
async def effective_config(daemon: Daemon) -> dict[str, Any]:
    return daemon.snapshot.redacted()


@router.get("/status", response_model=ConfigStatusView)
async def config_status(daemon: Daemon) -> ConfigStatusView:
    return ConfigStatusView(
        generation=daemon.generation, digest=daemon.snapshot.digest, last_reload=daemon.last_reload
    )
