"""Arrays: upload a .npy body to use as a job input, streamed from the request into its file."""

from __future__ import annotations

from fastapi import APIRouter, Request

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.models import ArrayView
from taogpud.api.peer import peer_of

router = APIRouter(tags=["arrays"])


@router.post(
    wire.UPLOAD_ARRAY.path,
    response_model=ArrayView,
    status_code=201,
    openapi_extra={
        "requestBody": {
            "content": {
                "application/octet-stream": {"schema": {"type": "string", "format": "binary"}}
            },
            "required": True,
        }
    },
)
async def upload(request: Request, daemon: Daemon) -> ArrayView:
    """The array belongs to the caller: only they (root, group taogpu-admin) may use its id."""
    array_id, ref = await daemon.arrays.upload(
        request.stream(), daemon.limits.max_upload_bytes, peer_of(request)
    )
    return ArrayView(id=array_id, shape=list(ref.shape), dtype=ref.dtype, nbytes=ref.nbytes)
