"""Generated requests from the served OpenAPI document: none may cause a server error."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from taogpud.testing import RunningDaemon
from taogpud.testing.fuzzing import FUZZ_CONFIG, FUZZ_SETTINGS, fuzz

EXAMPLES_PER_OPERATION = 25  # scripts/soak.py runs many more

pytestmark = pytest.mark.slow  # a few hundred generated requests


def test_schemathesis_finds_no_server_error(daemon_factory: Callable[..., RunningDaemon]) -> None:
    """Every generated case gets a non-5xx answer, errors shaped {code, message, hint}."""
    daemon = daemon_factory(settings=FUZZ_SETTINGS, config=FUZZ_CONFIG)
    report = fuzz(daemon.socket_path, EXAMPLES_PER_OPERATION)
    assert report.cases >= 100
    assert report.failures == []
    with daemon.client() as client:
        assert client.health()["ok"]
    assert daemon.stderr().count("Traceback") == 0
