"""On a real GPU, outputs on the shared-memory path come back by a device-to-host copy straight
into the client's memory (cupy.asnumpy(out=)), with no host array between. Skipped without a
GPU (`make test-gpu`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from tests.test_gpu import CUDA_PROBLEM, cuda_daemon

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.timeout(600),  # a first warm-up on an empty kernel cache takes minutes
    pytest.mark.skipif(CUDA_PROBLEM is not None, reason=f"needs a GPU: {CUDA_PROBLEM}"),
]


def test_gpu_outputs_land_in_the_clients_memory_by_d2h(
    daemon_factory: Callable[..., Any],
) -> None:
    """vector_add and matmul on CUDA: c lies in the client's memory, written "d2h"."""
    with cuda_daemon(daemon_factory).client() as client:
        a = client.empty(1 << 20, "float32")
        a[:] = np.arange(1 << 20, dtype=np.float32)
        out: Any = client.compute("vector_add", a=a, b=a)
        np.testing.assert_array_equal(out["c"], 2 * a)
        assert out.job["backend"] == "cuda" and out.job["outputs"][0]["written"] == "d2h"
        assert client._shared().arena.offset_of(out["c"]) == out.job["outputs"][0]["offset"]
        m = np.eye(64, dtype=np.float32)
        product: Any = client.compute("matmul", a=m, b=m)
        np.testing.assert_array_equal(product["c"], m)
        assert product.job["outputs"][0]["written"] == "d2h"
