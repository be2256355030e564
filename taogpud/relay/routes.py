"""The relay's control routes on the Unix socket: tokens and use. The caller is SO_PEERCRED's.

POST   /v1/relay/token          a new token for the caller (its previous one stops working)
DELETE /v1/relay/token[?uid=N]  revoke the caller's token; root may revoke anyone's
GET    /v1/relay/status         on/off, addresses, the channel, use per user and model
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request

from taogpud import wire
from taogpud.errors import NotPermitted, RequestError
from taogpud.host.unix_socket import peer_in
from taogpud.relay.forward import PREFIX, Relay, _channel_host

router = APIRouter(tags=["relay"])


def _relay(request: Request) -> Relay:
    # where relay.mount put the one the composition step built (daemon/compose.py)
    relay: Relay = request.app.state.relay
    return relay


def _caller_uid(request: Request) -> int:
    uid = peer_in(request.scope).uid
    if uid is None:
        raise RequestError(
            "the relay's tokens are handed out on the daemon's Unix socket only",
            "run `taogpuctl relay token` on this host",
        )
    return uid


@router.post(wire.RELAY_TOKEN.path)
async def issue_token(request: Request) -> dict[str, Any]:
    uid = _caller_uid(request)
    relay = _relay(request)
    return {"uid": uid, "token": relay.tokens.issue(uid), "listen": relay.tcp_address}


@router.delete(wire.RELAY_REVOKE.path)
async def revoke_token(
    request: Request, uid: Annotated[int | None, Query(ge=0, description="root only")] = None
) -> dict[str, Any]:
    caller = _caller_uid(request)
    target = caller if uid is None else uid
    if caller not in (target, 0):
        raise NotPermitted(
            f"uid {caller} may not revoke the relay token of uid {target}",
            "a user revokes their own token; root may revoke anyone's",
        )
    return {"uid": target, "revoked": _relay(request).tokens.revoke(target)}


@router.get(wire.RELAY_STATUS.path)
async def relay_status(request: Request) -> dict[str, Any]:
    relay = _relay(request)
    snapshot = relay.snapshot()
    settings = snapshot.config.relay
    uid = peer_in(request.scope).uid
    return {
        "enabled": settings.enabled,
        "listen": relay.tcp_address,
        "configured_listen": settings.listen,
        "unix_prefix": PREFIX,
        "channel": _channel_host(snapshot.settings.provider.base_url),
        "key_source": snapshot.key_source,
        "key_header": settings.key_header,
        "limits": settings.limits.model_dump(),
        "models": snapshot.show(snapshot.settings.models.model_dump()),
        "has_token": uid is not None and relay.tokens.has(uid),
        "token_fingerprint": None if uid is None else relay.tokens.fingerprint(uid),
        "use": relay.use.rows(),
    }
