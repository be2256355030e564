"""The daemon's half of `taogpuctl doctor`: the checks only the daemon can make."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request

from taogpud import wire
from taogpud.api.deps import Daemon
from taogpud.api.models import CheckView, DoctorView
from taogpud.api.peer import peer_of
from taogpud.doctor import report_ok
from taogpud.doctor.run import Options, daemon_checks, daemon_facts
from taogpud.i18n import accepted_language

router = APIRouter(tags=["doctor"])

MAX_DOCTOR_S = 600.0


@router.get(wire.DOCTOR.path, response_model=DoctorView)
async def doctor(
    request: Request,
    daemon: Daemon,
    ping: Annotated[bool, Query(description="ping the API channel (one tiny request)")] = True,
    probe: Annotated[bool, Query(description="run a probe job on every worker")] = True,
    timeout_s: Annotated[
        float, Query(gt=0, le=MAX_DOCTOR_S, description="caps the ping and the probes' wait")
    ] = 30.0,
) -> DoctorView:
    """Always 200 when the checks ran: `ok` is false when any check failed."""
    checks = await daemon_checks(daemon, peer_of(request), Options(ping, probe, timeout_s))
    language = accepted_language(request.headers.get("accept-language"))  # detail and hint
    return daemon.store.tell(  # the probes' and the recent jobs' states as a restart finds them
        lambda: DoctorView(
            ok=report_ok(checks),
            checks=[CheckView(**check.as_dict(language)) for check in checks],
            daemon=daemon_facts(daemon),
        )
    )
