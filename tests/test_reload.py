"""Hot reload against a real daemon and real files: saves by rename and in place, invalid
edits, files that vanish, live keys, rolling worker restarts, and no job lost."""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from traces import FINISHED_EVENTS

from taogpud.client import Client
from taogpud.testing import (
    CPU_CONFIG,
    CPU_SETTINGS,
    DaemonHandle,
    InProcessDaemon,
    RunningDaemon,
    ctl_command,
    deep_merge,
    to_toml,
    wait_until,
    write_text,
)

DEFAULT_QUIET_S = 2.0  # reload.quiet_s
# This module's daemons apply a watched save after 0.1 s of quiet: its saves are each whole
# (a rename, or one write the watcher sees end before it reports it), and its forty-odd
# reloads at the default would add over a minute. The default has its own test (the last).
QUICK_RELOAD = {"TAOGPUD_CONFIG__RELOAD__QUIET_S": "0.1"}
# The same in config.toml, for an in-process daemon (its environment is the test's); every
# config this module writes keeps it (write_config).
QUICK = {"reload": {"quiet_s": 0.1}}


@pytest.fixture
def daemon(daemon_factory: Callable[..., RunningDaemon]) -> RunningDaemon:
    return daemon_factory(env=QUICK_RELOAD)


@pytest.fixture
def inprocess_daemon(inprocess_factory: Callable[..., InProcessDaemon]) -> InProcessDaemon:
    return inprocess_factory(config=QUICK)


def ctl(daemon: DaemonHandle) -> list[str]:
    return ctl_command(daemon.socket_path)


def write_config(daemon: DaemonHandle, overrides: dict[str, Any], atomic: bool = True) -> None:
    """config.toml: the CPU config with `overrides`; atomic: as editors save (a rename)."""
    config = deep_merge(deep_merge(CPU_CONFIG, QUICK), overrides)
    write_text(daemon.config_path, to_toml(config), atomic)


def write_settings(daemon: DaemonHandle, overrides: dict[str, Any]) -> None:
    """settings.json: the CPU settings with `overrides`, saved by a rename."""
    write_text(daemon.settings_path, json.dumps(deep_merge(CPU_SETTINGS, overrides)), atomic=True)


def wait_generation(client: Client, generation: int, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = client.config_status()
        if (
            status["generation"] >= generation
            and status["last_reload"].get("generation") == generation
        ):
            return status
        time.sleep(0.02)
    raise AssertionError(
        f"generation {generation} not live after {timeout_s} s: {client.config_status()}"
    )


def wait_failed_reload(client: Client, after: float, timeout_s: float = 20.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        last = client.config_status()["last_reload"]
        if last.get("at") and last["at"] > after and not last["ok"]:
            return last
        time.sleep(0.02)
    raise AssertionError(f"no failed reload after {after}: {client.config_status()}")


def running_counts_after(daemon: DaemonHandle, generation: int) -> list[int]:
    """How many jobs ran right after each job started once `generation` was in force."""
    running: set[str] = set()
    counts, live = [], False
    for event in daemon.events():
        name = event.get("event")
        if name == "config.reloaded" and event["generation"] == generation:
            live = True
        elif name == "job.running":
            running.add(event["job_id"])
            if live:
                counts.append(len(running))
        elif name in FINISHED_EVENTS:
            running.discard(event.get("job_id", ""))
    return counts


def test_rename_save_and_in_place_write_are_both_seen(inprocess_daemon: InProcessDaemon) -> None:
    """An editor's rename-save and a plain in-place write each bring a new generation."""
    with inprocess_daemon.client() as client:
        write_config(inprocess_daemon, {"scheduling": {"max_concurrent_tasks": 3}}, atomic=True)
        wait_generation(client, 2)
        assert client.status()["max_concurrent_tasks"] == 3
        write_config(inprocess_daemon, {"scheduling": {"max_concurrent_tasks": 5}}, atomic=False)
        status = wait_generation(client, 3)
        assert client.status()["max_concurrent_tasks"] == 5
    changes = status["last_reload"]["changes"]
    assert changes == [{"key": "config.toml: scheduling.max_concurrent_tasks", "old": 3, "new": 5}]
    logged = inprocess_daemon.events("config.reloaded")[-1]
    assert logged["changes"][0]["key"] == "config.toml: scheduling.max_concurrent_tasks"


def test_invalid_edit_keeps_the_old_generation_until_fixed(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """A typo keeps generation 1 and is reported with file, key and fix; fixing it applies."""
    with inprocess_daemon.client() as client:
        before = time.time()
        inprocess_daemon.config_path.write_text(
            to_toml(deep_merge(CPU_CONFIG, {"scheduling": {"max_concurent_tasks": 2}}))
        )
        last = wait_failed_reload(client, before)
        assert client.config_status()["generation"] == 1
        assert client.status()["max_concurrent_tasks"] == 8
        assert client.run("noop")["status"] == "succeeded"
        write_config(inprocess_daemon, {"scheduling": {"max_concurrent_tasks": 2}})
        wait_generation(client, 2)
        assert client.status()["max_concurrent_tasks"] == 2
    error = last["errors"][0]
    assert (error["file"], error["key"]) == (
        str(inprocess_daemon.home / "config.toml"),
        "scheduling.max_concurent_tasks",
    )
    assert "max_concurrent_tasks" in error["fix"]
    assert inprocess_daemon.events("config.reload_failed")


def test_a_backend_mismatch_names_the_file_that_changed(inprocess_daemon: InProcessDaemon) -> None:
    """config.toml switched to CUDA under a settings.json that still says cpu: the reload's
    error names config.toml and its keys (it named settings.json gpu.backend, the file nobody
    touched); the same mismatch made in settings.json names settings.json."""
    with inprocess_daemon.client() as client:
        before = time.time()
        write_config(inprocess_daemon, {"runtime": {"device_type": "gpu"}})
        error = wait_failed_reload(client, before)["errors"][0]
        assert (error["file"], error["key"]) == (
            str(inprocess_daemon.config_path),
            "runtime.device_type",
        )
        assert 'settings.json gpu.backend "cpu"' in error["message"]
        fixed = time.time()
        write_config(inprocess_daemon, {})  # as it was: a reload that changes nothing, and succeeds
        wait_until(
            lambda: (
                client.config_status()["last_reload"].get("at", 0) > fixed
                and client.config_status()["last_reload"]["ok"]
            ),
            "the reload of config.toml as it was",
            timeout_s=30,
        )
        before = time.time()
        write_settings(inprocess_daemon, {"gpu": {"backend": "cuda"}})
        error = wait_failed_reload(client, before)["errors"][0]
    assert (error["file"], error["key"]) == (str(inprocess_daemon.settings_path), "gpu.backend")


def test_config_status_cli_reports_the_failed_reload(inprocess_daemon: InProcessDaemon) -> None:
    """`taogpuctl config status --json` shows last_reload.ok=false with the errors."""
    with inprocess_daemon.client() as client:
        before = time.time()
        inprocess_daemon.config_path.write_text("[scheduling\n")
        wait_failed_reload(client, before)
    result = subprocess.run(
        [*ctl(inprocess_daemon), "config", "status", "--json"],
        capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    view = json.loads(result.stdout)
    assert view["generation"] == 1
    assert view["last_reload"]["ok"] is False
    assert "line" in view["last_reload"]["errors"][0]["key"]


def test_vanished_emptied_and_directory_files_are_clear_errors(
    inprocess_daemon: InProcessDaemon,
) -> None:
    """Removed, emptied, or replaced by a directory: each a clear error, the daemon serves on."""
    original = inprocess_daemon.config_path.read_text()
    breakages: list[Callable[[], None]] = [
        inprocess_daemon.config_path.unlink,
        lambda: inprocess_daemon.config_path.write_text(""),
        lambda: (inprocess_daemon.config_path.unlink(), inprocess_daemon.config_path.mkdir()),
    ]
    messages = []
    with inprocess_daemon.client() as client:
        for break_it in breakages:
            before = time.time()
            break_it()
            messages.append(wait_failed_reload(client, before)["errors"][0]["message"])
            assert client.run("noop")["status"] == "succeeded"
            if inprocess_daemon.config_path.is_dir():
                inprocess_daemon.config_path.rmdir()
            inprocess_daemon.config_path.write_text(original)
            time.sleep(0.3)
        assert client.config_status()["generation"] == 1
    assert "does not exist" in messages[0]
    assert "empty" in messages[1]
    assert "directory" in messages[2]


def test_cap_raised_and_lowered_under_a_stream_of_jobs(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """While sleep jobs stream in, max_concurrent_tasks 2 → 4 → 1 each holds once live."""
    daemon = inprocess_factory(config={**QUICK, "scheduling": {"max_concurrent_tasks": 2}})
    stop = threading.Event()
    submitted: list[str] = []

    def stream() -> None:
        with daemon.client() as client:
            while not stop.is_set():
                if client.status()["queued"] < 6:
                    submitted.append(client.submit("sleep", {"ms": 80})["id"])
                time.sleep(0.01)

    feeder = threading.Thread(target=stream)
    feeder.start()
    try:
        with daemon.client() as client:
            wait_until(lambda: client.status()["running"] == 2, "the stream at the cap of 2")
            write_config(daemon, {"scheduling": {"max_concurrent_tasks": 4}})
            wait_generation(client, 2)
            wait_until(
                lambda: 4 in running_counts_after(daemon, 2), "four running under the cap of 4"
            )
            write_config(daemon, {"scheduling": {"max_concurrent_tasks": 1}})
            wait_generation(client, 3)
            time.sleep(0.8)
    finally:
        stop.set()
        feeder.join(30)
    with daemon.client() as client:
        jobs = [client.wait(job_id, timeout_s=60) for job_id in submitted]
    assert {job["status"] for job in jobs} == {"succeeded"}
    raised, lowered = running_counts_after(daemon, 2), running_counts_after(daemon, 3)
    assert max(raised) == 4
    first_start_under_one = next(i for i, n in enumerate(lowered) if n == 1)
    assert set(lowered[first_start_under_one:]) == {1}


def test_rolling_restart_finishes_running_jobs_first(inprocess_daemon: InProcessDaemon) -> None:
    """thread_num changes: every running job succeeds, then each device gets a new worker."""
    with inprocess_daemon.client() as client:
        old_pids = {w["device"]: w["pid"] for w in client.status()["workers"]}
        jobs = [client.submit("sleep", {"ms": 400})["id"] for _ in range(4)]
        inprocess_daemon.wait_running(jobs[-1])
        write_config(inprocess_daemon, {"runtime": {"thread_num": 2}})
        status = wait_generation(client, 2)
        finished = [client.wait(job_id) for job_id in jobs]
        new_pids = {w["device"]: w["pid"] for w in client.status()["workers"]}
        after = client.run("noop")
    assert [job["status"] for job in finished] == ["succeeded"] * 4
    assert status["last_reload"]["restarted_workers"] is True
    assert all(new_pids[device] != pid for device, pid in old_pids.items())
    assert after["status"] == "succeeded"
    events = inprocess_daemon.events()
    for device in old_pids:  # each device is replaced only after its own jobs ended
        ended = [
            i
            for i, e in enumerate(events)
            if e.get("event") == "job.succeeded" and e["job_id"] in jobs and e["device"] == device
        ]
        rolled = next(
            i
            for i, e in enumerate(events)
            if e.get("event") == "worker.rolled" and e["device"] == device
        )
        assert ended and max(ended) < rolled


@pytest.mark.slow  # a thousand jobs and twenty reloads: a soak, in make test, not the quick loop
def test_twenty_reloads_during_a_thousand_jobs_lose_none(inprocess_daemon: InProcessDaemon) -> None:
    """Jobs from 4 clients across 20 reloads (two of them rolling): each client runs 250
    and goes on until the last reload is live, so that every reload meets jobs in flight
    (1,000 jobs alone took about a second, and the reloads after it met none); every job
    succeeds."""
    daemon = inprocess_daemon
    reloaded = threading.Event()
    statuses: list[list[str]] = []  # one list a client, once it is done
    lock = threading.Lock()

    def client_thread() -> None:
        got: list[str] = []
        with daemon.client() as client:
            while len(got) < 250 or not reloaded.is_set():
                got.append(client.run("noop")["status"])
                time.sleep(0.005)  # a stream, not a flood: the host's cores are shared
        with lock:
            statuses.append(got)

    threads = [threading.Thread(target=client_thread) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        with daemon.client() as client:
            for generation in range(2, 22):
                overrides: dict[str, Any] = {
                    "scheduling": {"max_concurrent_tasks": 3 + generation % 3}
                }
                if generation in (8, 15):
                    overrides["runtime"] = {"thread_num": 1 + generation % 2}
                write_config(daemon, overrides)
                wait_generation(client, generation)
    finally:
        reloaded.set()
        for thread in threads:
            thread.join(120)
    assert len(statuses) == 4  # every client ended its run
    assert all(len(got) >= 250 for got in statuses)
    assert {status for got in statuses for status in got} == {"succeeded"}
    assert len(daemon.events("config.reloaded")) == 20


def test_memory_fraction_and_log_level_apply_live(inprocess_daemon: InProcessDaemon) -> None:
    """memoryFraction changes each device's cap without new workers; level=error hides job lines."""
    with inprocess_daemon.client() as client:
        before = {d["device"]: d for d in client.devices()}
        write_settings(
            inprocess_daemon, {"gpu": {"memoryFraction": 0.425}, "logging": {"level": "error"}}
        )
        status = wait_generation(client, 2)
        time.sleep(0.2)  # the workers answer with their new caps
        after = {d["device"]: d for d in client.devices()}
        job = client.run("noop")
    assert status["last_reload"]["restarted_workers"] is False
    for device, old in before.items():  # 0.425 is half of 0.85: half the cap, give or take rounding
        assert abs(after[device]["memory_cap_bytes"] * 2 - old["memory_cap_bytes"]) <= 2
        assert after[device]["memory_total_bytes"] == old["memory_total_bytes"]
    assert [e for e in inprocess_daemon.events("job.succeeded") if e["job_id"] == job["id"]] == []


def test_sighup_and_the_api_reload_on_demand(daemon: RunningDaemon) -> None:
    """SIGHUP and `taogpuctl config reload` re-read the files; no change keeps the generation."""
    daemon.proc.send_signal(signal.SIGHUP)
    unchanged = daemon.wait_for_event(lambda e: e.get("event") == "config.unchanged")
    assert unchanged["trigger"] == "SIGHUP"
    result = subprocess.run(
        [*ctl(daemon), "config", "reload", "--json"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0
    view = json.loads(result.stdout)
    assert (view["ok"], view["generation"], view["changes"]) == (True, 1, [])
    assert view["trigger"] == "api"


def test_invalid_reload_through_the_cli_exits_2(inprocess_daemon: InProcessDaemon) -> None:
    """`taogpuctl config reload` on a broken pair exits 2 and names the key."""
    inprocess_daemon.config_path.write_text('[runtime]\ndevice_type = "tpu"\n')
    result = subprocess.run(
        [*ctl(inprocess_daemon), "config", "reload"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "runtime.device_type" in result.stdout


def test_a_file_saved_in_two_writes_a_second_apart_is_applied_whole(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """An editor writes config.toml in place in two steps 1 s apart, the first half valid on
    its own ([scheduling] not there yet). The reload waits until the files have been quiet
    for reload.quiet_s (its default), so the one new generation holds both halves. Before,
    the first half was applied half a second after it was written, then the whole."""
    daemon = inprocess_factory()  # the default quiet period, not this module's short one
    text = to_toml(
        deep_merge(
            CPU_CONFIG,
            {"memory": {"upload_quota_mb": 2}, "scheduling": {"max_concurrent_tasks": 3}},
        )
    )
    cut = text.index("[scheduling]")
    with daemon.client() as client:
        with daemon.config_path.open("w") as file:
            file.write(text[:cut])
            file.flush()
            first_half_at = time.monotonic()
            time.sleep(1.0)
            file.write(text[cut:])
        gap_s = time.monotonic() - first_half_at
        if gap_s >= DEFAULT_QUIET_S:  # then applying the first half would be right
            pytest.skip(f"the host held this test {gap_s:.1f} s between the two writes")
        status = wait_generation(client, 2)
        assert client.status()["max_concurrent_tasks"] == 3
    assert {change["key"] for change in status["last_reload"]["changes"]} == {
        "config.toml: memory.upload_quota_mb",
        "config.toml: scheduling.max_concurrent_tasks",
    }
    assert [event["generation"] for event in daemon.events("config.reloaded")] == [2]
    assert daemon.events("config.reload_failed") == []
