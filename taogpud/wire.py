"""The shapes both sides of the control API speak, so the core never imports `taogpud.api`.

A job request (what `POST /v1/jobs` and the `.shm` socket take and the scheduler admits) and a
reload's report (what the reloader writes, the state keeps and `GET /v1/config/status` shows).
Job states are `taogpud.jobs.JobState`; the API's own views stay in `taogpud.api.models`,
which names these too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class JobRequest(BaseModel):
    task: str = Field(description="a registered task name, see GET /v1/tasks")
    params: dict[str, Any] = Field(default_factory=dict)
    inputs: dict[str, str] = Field(
        default_factory=dict, description="input name → array id from POST /v1/arrays"
    )
    device: int | None = Field(default=None, ge=0, description="pin to this device index")
    affinity: str | None = Field(
        default=None, max_length=200, description="jobs of one key stay on one device"
    )
    priority: int = Field(default=0, ge=-1000, le=1000, description="higher runs first")
    timeout_s: float | None = Field(default=None, gt=0, le=7 * 86400)
    keep_outputs: bool = Field(default=False, description="keep the output arrays for download")
    max_retries: int = Field(
        default=0, ge=0, le=10, description="run again after a worker crash or daemon restart"
    )


class ChangeView(BaseModel):
    key: str  # "config.toml: scheduling.max_concurrent_tasks"
    old: Any
    new: Any


class ReloadView(BaseModel):
    ok: bool
    at: float | None = None  # unix time the reload finished; None: none since start
    trigger: str | None = None  # "watch" | "SIGHUP" | "api", or requests joined: "watch+SIGHUP"
    generation: int | None = None  # the generation in force after it
    changes: list[ChangeView] = Field(default_factory=list)
    restarted_workers: bool = False
    errors: list[dict[str, str]] = Field(default_factory=list)
    warnings: list[dict[str, str]] = Field(default_factory=list)
