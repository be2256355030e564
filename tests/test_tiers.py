"""The quick tier's marker (tests/conftest.py): a test whose fixtures start a daemon process
is marked `process`, so `make test-quick` leaves it out; one on the in-process daemon, or
with no daemon, stays in."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


def marked_process(request: pytest.FixtureRequest) -> bool:
    return request.node.get_closest_marker("process") is not None


def test_a_daemon_factory_marks_the_test(
    request: pytest.FixtureRequest, daemon_factory: Callable[..., Any]
) -> None:
    assert marked_process(request)


def test_a_daemon_home_alone_marks_the_test(
    request: pytest.FixtureRequest, daemon_home: Any
) -> None:
    assert marked_process(request)


def test_the_in_process_daemon_does_not(
    request: pytest.FixtureRequest, inprocess_factory: Callable[..., Any]
) -> None:
    assert not marked_process(request)


def test_no_daemon_does_not(request: pytest.FixtureRequest) -> None:
    assert not marked_process(request)


def test_a_process_beside_the_in_process_daemon_marks_the_test(
    request: pytest.FixtureRequest,
    inprocess_factory: Callable[..., Any],
    daemon_factory: Callable[..., Any],
) -> None:
    assert marked_process(request)
