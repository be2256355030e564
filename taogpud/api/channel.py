"""The API channel: the guide's ping, sent by the daemon with the key only it holds."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.provider import channel
from taogpud.provider.channel import ChannelSettings, ModelRole, PingResult

router = APIRouter(tags=["channel"])

MAX_PING_S = 3600.0


@router.post(wire.CHANNEL_PING.path, response_model=PingResult)
async def ping(
    daemon: Daemon,
    model: Annotated[ModelRole, Query(description="which of settings.json models.* to ask")] = (
        "default"
    ),
    timeout_s: Annotated[
        float | None, Query(gt=0, le=MAX_PING_S, description="caps the whole ping, retries too")
    ] = None,
) -> PingResult:
    """Always 200 when the ping ran: `ok` and `status` say how the channel answered."""
    settings = ChannelSettings.from_snapshot(daemon.status.snapshot)
    return await channel.ping(settings, model, deadline_s=timeout_s)
