"""POST /v1/mcp/calls: `taogpuctl mcp` tells of each tool call, and it becomes one `mcp.call`
line of the trace, beside the jobs and the relay's requests (docs/agents.md).

Why an endpoint: one tool call is one request or several (gpu_status asks for the status,
the devices and the catalog; run_task submits, then waits), and run_task's job id exists
only after its submit, so a mark on each request (a header) would give lines per request,
not per call, and none with the job. The MCP server calls this once a call has ended, on the
same connection. The line's uid, gid and pid are the daemon's own facts (SO_PEERCRED); the
tool, the outcome and the job are what that process says. The job goes in `job_id`, which
puts the line among that job's own (GET /v1/jobs/{id}/events), only when the caller may act
on the job (its owner, root, group taogpu-admin); any other id it names, unknown or another
user's, goes in `named_job_id`, so nobody writes lines into someone else's job.
"""

from __future__ import annotations

from fastapi import APIRouter, Request

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.models import McpCallModel, McpCallView
from taogpud.api.peer import peer_of
from taogpud.daemon.state import DaemonState
from taogpud.errors import JobNotFound
from taogpud.jobs.access import may_touch
from taogpud.jobs.records import Peer
from taogpud.observability import trace

router = APIRouter(tags=["agents"])


@router.post(wire.MCP_CALL.path, response_model=McpCallView)
async def mcp_call(call: McpCallModel, request: Request, daemon: Daemon) -> McpCallView:
    peer = peer_of(request)
    fields: dict[str, object] = {"uid": peer.uid, "gid": peer.gid, "pid": peer.pid}
    fields |= {"tool": call.tool, "ok": call.ok}
    if call.error_code is not None:
        fields["error_code"] = call.error_code
    own = call.job_id is not None and callers_job(daemon, call.job_id, peer)
    if call.job_id is not None:
        fields["job_id" if own else "named_job_id"] = call.job_id
    trace.deferred("info", "mcp.call", **fields)
    return McpCallView(uid=peer.uid, job_id=call.job_id if own else None)


def callers_job(daemon: DaemonState, job_id: str, peer: Peer) -> bool:
    """Whether `job_id` is a job `peer` may act on."""
    try:
        job = daemon.scheduler.get(job_id)
    except JobNotFound:
        return False
    return job.peer.uid is None or may_touch(job.peer.uid, peer)
