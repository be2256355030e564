"""Who may touch what: a job's or an array's owner, root, or a member of the admin group.

Identities come from SO_PEERCRED on the Unix socket (unix_socket.py), never from
anything a client says about itself.

What another user sees of a job (`view_of`): that it exists, its task, state, device and
timings, so everyone can tell what the GPUs are busy with, but none of what it holds: its
params, input array ids, affinity key, result, outputs, evidence and error message are
blanked. Array ids are useless to anyone but their owner anyway (another user's id is
answered exactly as an unknown one), so nothing shown grants access.
"""

from __future__ import annotations

import grp
import os
import pwd
from typing import Any

from taogpud.errors import NotPermitted
from taogpud.i18n import Text
from taogpud.jobs.records import JobErrorView, JobRecord, Peer

ADMIN_GROUP = "taogpu-admin"
HIDDEN = "(another user's job: only its owner, root or group taogpu-admin see this)"


def may_touch(owner_uid: int | None, peer: Peer) -> bool:
    """Whether `peer` may use what `owner_uid` made. A peer of no uid is not on the Unix
    socket (nothing serves elsewhere); an owner of no uid was made by such a peer."""
    if peer.uid is None or peer.uid in (0, owner_uid):
        return True
    return _in_admin_group(peer)


def check_access(job: JobRecord, peer: Peer, action: str) -> None:
    """Raise NotPermitted unless `peer` may `action` ("cancel", "read the outputs of") the job."""
    if job.peer.uid is None or may_touch(job.peer.uid, peer):
        return
    raise NotPermitted(
        Text(
            "job {job_id} belongs to uid {owner}; uid {uid} may not {action} it",
            job_id=job.id,
            owner=job.peer.uid,
            uid=peer.uid,
            action=action,
        ),
        Text("only the job's owner, root or a member of group {group} may", group=ADMIN_GROUP),
    )


def view_of(job: JobRecord, peer: Peer) -> JobRecord:
    """The job as `peer` may see it: whole for its owner, else without what it holds."""
    if job.peer.uid is None or may_touch(job.peer.uid, peer):
        return job
    error = job.error and JobErrorView(code=job.error.code, message=HIDDEN)
    hidden: dict[str, Any] = {"params": {}, "inputs": {}, "affinity": None, "result": None}
    return job.model_copy(update={**hidden, "outputs": [], "evidence": {}, "error": error})


def _in_admin_group(peer: Peer) -> bool:
    try:
        admin_gid = grp.getgrnam(ADMIN_GROUP).gr_gid
    except KeyError:
        return False
    if peer.gid == admin_gid:
        return True
    try:
        name = pwd.getpwuid(peer.uid or 0).pw_name
    except KeyError:
        return False
    return admin_gid in os.getgrouplist(name, peer.gid or 0)


def may_see(peer: Peer, owner_uid: int | None) -> bool:
    """Whether `peer` may read a trace line about uid `owner_uid` (None: the daemon's own)."""
    if peer.uid is None or peer.uid == 0 or owner_uid in (None, peer.uid):
        return True
    return _in_admin_group(peer)
