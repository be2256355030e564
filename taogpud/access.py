"""Who may touch a job: its owner, root, or a member of the admin group.

Identities come from SO_PEERCRED on the Unix socket (api/peer.py), never from
anything a client says about itself.
"""

from __future__ import annotations

import grp
import os
import pwd

from taogpud.errors import NotPermitted
from taogpud.jobs import JobRecord, Peer

ADMIN_GROUP = "taogpu-admin"


def check_access(job: JobRecord, peer: Peer, action: str) -> None:
    """Raise NotPermitted unless `peer` may `action` ("cancel", "read the outputs of") the job."""
    if peer.uid is None or peer.uid == 0 or job.peer.uid in (None, peer.uid):
        return
    if _in_admin_group(peer):
        return
    raise NotPermitted(
        f"job {job.id} belongs to uid {job.peer.uid}; uid {peer.uid} may not {action} it",
        f"only the job's owner, root or a member of group {ADMIN_GROUP} may",
    )


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
