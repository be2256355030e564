"""What goes down to a worker for a job: its RunJob order, with its inputs (images in
/dev/shm from the array store, or regions in a client's own memory) and where its outputs
go (the kept-outputs folder, or a region of the client's memory). It also holds the client
memory each such job names until the job ends (memory.py's JobRegions).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from taogpud.arrayfiles.store import ArrayStore
from taogpud.jobs.memory import JobRegions
from taogpud.pool import protocol as msg
from taogpud.pool.interface import Worker


class Orders:
    def __init__(self, arrays: ArrayStore, outputs_dir: Path) -> None:
        self.arrays = arrays
        self.outputs_dir = outputs_dir  # kept outputs: <outputs_dir>/<job id>/<name>.npy
        self._regions: dict[str, JobRegions] = {}  # job id → its regions in a client's memory

    def hold(self, job_id: str, regions: JobRegions) -> None:
        """The job's inputs and output are in a client's memory, held until it ends."""
        self._regions[job_id] = regions

    def let_go(self, job_id: str) -> JobRegions | None:
        """The job ended (or never was): its regions, for the caller to release, if any."""
        return self._regions.pop(job_id, None)

    def inputs(self, job_id: str, inputs: dict[str, str]) -> dict[str, Any]:
        """The job's inputs as the worker maps them; an array the store lost is None."""
        regions = self._regions.get(job_id)
        if regions is not None:
            return dict(regions.inputs)
        return {name: self.arrays.get(array_id) for name, array_id in inputs.items()}

    def send(
        self,
        worker: Worker,
        job_id: str,
        task: str,
        params: dict[str, Any],
        keep_outputs: bool,
        inputs: dict[str, Any],
    ) -> float:
        """The order to the worker, and when it left; the result is read in a later callback
        of the loop. At submit the order leaves before the daemon notes the start (15–20 µs
        of a tiny job's round trip in an A/B of bench/run.py's dispatch): the job is not
        accepted until the API's commit, so a crash in between leaves no job to run again.
        From the queue, Scheduler.dispatch commits the start first."""
        output_dir = str(self.outputs_dir / job_id) if keep_outputs else None
        regions = self._regions.get(job_id)
        output_region = regions.output if regions is not None else None
        sent_at = time.time()  # its start: the worker may run before the daemon notes it
        worker.send(msg.RunJob(job_id, task, params, inputs, output_dir, output_region))
        return sent_at
