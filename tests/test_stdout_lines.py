"""stdout is the trace: JSON lines and nothing else, whatever the code in the daemon prints.

The daemon and its workers write their JSON lines to descriptor 1 (the journal's stream under
systemd); `jq`, `journalctl -o cat` and the guide's grep read it as lines of JSON. Code that
prints to sys.stdout beside them (a task plug-in's debugging print, Ray's driver relaying its
raylet: tests/test_ray_executor.py) goes to stderr, which the journal keeps too.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from taogpud.testing import RunningDaemon, wait_until

PRINTING_PLUGIN = """
from pydantic import BaseModel, ConfigDict
from taogpud.tasks.base import Task, TaskOutput


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")


def chatty(ctx, params):
    print("chatty: a task's own print, half a line", end="", flush=True)
    print(" and the rest of it")
    return TaskOutput(summary={"said": True})


TASKS = [Task("chatty", "prints while it runs", Params, chatty, lambda params: 0)]
"""


def install_printing_plugin(site: Path) -> dict[str, str]:
    """A distribution in `site` whose task prints; the environment that makes it found."""
    dist_info = site / "taogpud_chatty-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (site / "taogpud_chatty.py").write_text(PRINTING_PLUGIN)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: taogpud-chatty\n")
    (dist_info / "entry_points.txt").write_text("[taogpud.tasks]\nchatty = taogpud_chatty:TASKS\n")
    return {"PYTHONPATH": str(site)}


def test_a_task_that_prints_leaves_stdout_json(
    daemon_factory: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """A task's print in the worker, half a line and then the rest, lands on stderr; stdout
    holds only the trace's JSON lines, the job's among them."""
    daemon = daemon_factory(env=install_printing_plugin(tmp_path / "site"))
    with daemon.client() as client:
        job = client.run("chatty", wait_s=30)
    assert job["status"] == "succeeded", job
    wait_until(lambda: "and the rest of it" in daemon.stderr(), "the task's print on stderr", 10)
    assert "chatty: a task's own print, half a line and the rest of it" in daemon.stderr()
    lines = daemon.stdout_text().splitlines()
    assert [line for line in lines if line[:1] != "{"] == []
    events = [json.loads(line) for line in lines]
    assert [e["event"] for e in events if e.get("job_id") == job["id"]][-1] == "job.succeeded"
