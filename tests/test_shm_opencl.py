"""The shared-memory path on a device backend: outputs come back by a read straight into the
client's memory (pyopencl's get(ary=)), with no host copy between. A real PoCL device."""

from __future__ import annotations

import contextlib
import io
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from taogpud.client import DaemonUnreachable
from taogpud.testing import RunningDaemon
from tests.test_opencl import opencl_config, opencl_settings, requires_opencl

pytestmark = pytest.mark.xdist_group("opencl")  # test_opencl's worker: its PoCL cache is warm
WARM_TIMEOUT_S = 300  # PoCL builds every kernel at warm-up: minutes on a busy 2-core host


@pytest.fixture
def opencl_daemon(daemon_factory: Callable[..., RunningDaemon], pocl_cache: Path) -> RunningDaemon:
    """One PoCL device, warm (its kernels built once a session, in the session's cache)."""
    env = {"POCL_DEVICES": "pthread", "POCL_CACHE_DIR": str(pocl_cache)}
    daemon = daemon_factory(opencl_settings(), opencl_config((0,)), env, False)
    deadline = time.monotonic() + WARM_TIMEOUT_S
    while time.monotonic() < deadline and daemon.proc.poll() is None:
        with contextlib.suppress(DaemonUnreachable, OSError), daemon.client(timeout_s=5) as client:
            if client.health().get("ok"):
                return daemon
        time.sleep(0.2)
    raise AssertionError(f"the OpenCL daemon was not warm: {daemon.stderr()}")


@requires_opencl
@pytest.mark.slow
def test_device_outputs_land_in_the_clients_memory_by_d2h(opencl_daemon: RunningDaemon) -> None:
    """vector_add on an OpenCL device: c is read into the client's memory, said "d2h"."""
    with opencl_daemon.client() as client:
        a = client.empty(4096, "float32")
        a[:] = np.arange(4096, dtype=np.float32)
        out: Any = client.compute("vector_add", a=a, b=a)
        np.testing.assert_array_equal(out["c"], 2 * a)
        assert out.job["backend"] == "opencl"
        assert out.job["outputs"][0]["written"] == "d2h"
        assert client._shared().arena.offset_of(out["c"]) == out.job["outputs"][0]["offset"]
        kept = client.run("vector_add", {"size": 1000}, keep_outputs=True, wait_s=120)
        c = np.load(io.BytesIO(client.download_output(kept["id"], "c")))  # a file, as before
        assert kept["outputs"][0]["written"] is None
        assert float(c.sum(dtype=np.float64)) == pytest.approx(kept["result"]["checksum"])
