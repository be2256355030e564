"""taogpud.testing, the harness that tests, bench and scripts share: importable without pytest,
and a daemon started through it leaves nothing behind."""

from __future__ import annotations

import ast
import asyncio
import gc
import json
import multiprocessing
import multiprocessing.resource_tracker
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import taogpud
from taogpud.config import load
from taogpud.daemon.lifecycle import loop_factory
from taogpud.testing import (
    CPU_CONFIG,
    HarnessError,
    InProcessDaemon,
    RunningDaemon,
    cpu_pair,
    ctl_env,
    in_process,
    new_home,
    parse_trace,
    remove_home,
    start_daemon,
    start_in_process,
    to_toml,
    wait_until,
    whole_lines,
    write_pair,
)

# Run in a fresh interpreter where importing pytest fails, as in a bench or a script.
WITHOUT_PYTEST = "import sys; sys.modules['pytest'] = sys.modules['_pytest'] = None\n"
START_AND_STOP = """
import json, os
from pathlib import Path
from taogpud import testing

def tree(pid):
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [pid] + [p for kid in kids for p in tree(kid)]

seen = {}
remove_home = testing.remove_home
def looked_at(home):  # what the stopped daemon left, just before its home is removed
    seen["socket_left"] = (home / "taogpud.sock").exists()
    remove_home(home)
testing.remove_home = looked_at

with testing.running() as daemon:
    assert daemon.healthy()
    seen.update(pids=tree(daemon.proc.pid), home=str(daemon.home))
seen["exit"] = daemon.proc.returncode
print(json.dumps(seen))
"""


def run_without_pytest(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_PYTEST + code],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


def alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


@pytest.mark.process
def test_the_harness_imports_without_pytest() -> None:
    """`import taogpud.testing` in an interpreter where pytest cannot be imported succeeds."""
    done = run_without_pytest("import taogpud.testing\nprint(taogpud.testing.running.__name__)")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "running"


@pytest.mark.process
def test_running_leaves_no_process_no_socket_and_no_home() -> None:
    """A daemon started and stopped through `testing.running()` (without pytest): it drained
    (exit 0), removed its socket, and it and every worker it spawned are gone, as is its home."""
    done = run_without_pytest(START_AND_STOP)
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert len(seen["pids"]) >= 3, seen  # the daemon and its two CPU workers at least
    wait_until(lambda: not any(map(alive, seen["pids"])), "every process to be gone")
    assert seen["exit"] == 0  # a drain, not the kill -9 after the timeout
    assert seen["socket_left"] is False  # the daemon removed its socket as it stopped
    assert not Path(seen["home"]).exists()


@pytest.mark.process
def test_stop_kills_a_daemon_that_does_not_drain_in_time() -> None:
    """A daemon frozen with SIGSTOP ignores SIGTERM: stop() waits its timeout, then kill -9."""
    home = new_home()
    try:
        daemon = start_daemon(home, None, None)
        os.kill(daemon.proc.pid, signal.SIGSTOP)
        started = time.monotonic()
        assert daemon.stop(timeout_s=0.5) == -signal.SIGKILL
        assert time.monotonic() - started >= 0.5
    finally:
        remove_home(home)


def test_write_pair_writes_what_the_loader_reads(tmp_path: Path) -> None:
    """Mappings are serialised as JSON and TOML, strings written as they are; `load` reads both."""
    settings, config = cpu_pair(config={"scheduling": {"max_concurrent_tasks": 3}})
    pair = write_pair(tmp_path / "a", settings, config)
    assert load(*pair, environ={}).config.scheduling.max_concurrent_tasks == 3
    as_text = write_pair(tmp_path / "b", json.dumps(settings), to_toml(config))
    assert as_text.settings.read_text() == pair.settings.read_text()
    assert as_text.config.read_text() == pair.config.read_text()
    assert pair.flags() == ["--settings", str(pair.settings), "--config", str(pair.config)]


def test_cpu_pair_merges_overrides_without_changing_the_defaults() -> None:
    """Overrides land table by table; CPU_CONFIG itself is untouched."""
    _, config = cpu_pair(config={"runtime": {"thread_num": 4}})
    assert config["runtime"] == {"device_type": "cpu", "thread_num": 4, "cpu_devices": 2}
    assert CPU_CONFIG["runtime"]["thread_num"] == 1


def test_wait_until_names_what_never_happened() -> None:
    """A condition that stays false: HarnessError (an AssertionError) naming it, once late."""
    with pytest.raises(AssertionError, match=r"never happened within 0\.05 s: the sky to fall"):
        wait_until(lambda: False, "the sky to fall", timeout_s=0.05)


def test_taogpuctl_drops_the_key_and_the_control_variables(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A child started by ctl_env never inherits TAOTOKEN_API_KEY or TAOGPUD_SOCKET; `env` wins."""
    monkeypatch.setenv("TAOTOKEN_API_KEY", "sk-never-in-a-child")
    monkeypatch.setenv("TAOGPUD_SOCKET", "/nowhere.sock")
    child = ctl_env({"EXTRA": "1"})
    assert "TAOTOKEN_API_KEY" not in child and "TAOGPUD_SOCKET" not in child
    assert child["EXTRA"] == "1"


REPO = Path(__file__).resolve().parent.parent
AS_MODULES = [
    ("bench.run", "--help"),
    ("bench.cli_start", "--help"),
    ("bench.reload_latency", "--help"),
    ("bench.relay", "--help"),
    ("bench.ray_executor", "--help"),
    ("bench.ray_shm", "--help"),
    ("bench.ab", "--help"),
    ("bench.shm_path", "--help"),
    ("bench.refactor_guard", "--help"),
    ("scripts.soak", "--help"),
    ("scripts.gpu_check", "--test-files"),
]


@pytest.mark.process
@pytest.mark.parametrize(("module", "flag"), AS_MODULES)
def test_bench_and_scripts_run_as_modules_from_the_root(module: str, flag: str) -> None:
    """`python -m MODULE` from the repository's root with no PYTHONPATH: it finds taogpud and
    the harness by itself (what `make bench` and `make gpu-check` run)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-m", module, flag],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout


def test_no_source_outside_the_tests_puts_a_folder_on_sys_path() -> None:
    """bench/ and scripts/ import by package, never by a folder put on sys.path by hand."""
    sources = [*REPO.glob("bench/**/*.py"), *REPO.glob("scripts/**/*.py")]
    inserting = [str(p.relative_to(REPO)) for p in sources if "sys.path.insert" in p.read_text()]
    assert sources and inserting == []


def test_children_run_the_code_the_harness_imported(monkeypatch: pytest.MonkeyPatch) -> None:
    """Started from another folder with no PYTHONPATH of its own, a child of the harness
    imports this checkout's taogpud, not whichever one the venv holds."""
    monkeypatch.delenv("PYTHONPATH", raising=False)
    done = subprocess.run(
        [sys.executable, "-c", "import taogpud; print(taogpud.__file__)"],
        cwd="/", env=ctl_env(), capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert Path(done.stdout.strip()) == Path(taogpud.__file__)


def test_a_line_still_being_written_is_not_read_yet() -> None:
    """The daemon writes its stdout while a test reads it, so a read can end inside a line (a
    CI run read `{"method":"GET",...,"event":"api.request` and failed on its JSON). Only whole
    lines are read: the rest is there at the next read."""
    written = '{"event":"job.succeeded"}\n{"method":"GET","event":"api.req'
    assert parse_trace(written) == [{"event": "job.succeeded"}]
    assert whole_lines(written) == '{"event":"job.succeeded"}\n'
    assert whole_lines(written + 'uest"}\n') == written + 'uest"}\n'
    assert whole_lines("") == ""


def process_wide() -> dict[str, object]:
    """What belongs to the whole test process, which an in-process daemon must leave as it was."""
    umask = os.umask(0o022)
    os.umask(umask)
    return {
        "threads": sorted(t.name for t in threading.enumerate()),
        "fds": sorted(fd.name for fd in Path("/proc/self/fd").iterdir()),
        "umask": umask,
        "signals": [signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)],
        "environ": dict(os.environ),
        "frozen": gc.get_freeze_count(),
        "children": [p.name for p in multiprocessing.active_children()],
    }


def test_an_in_process_daemon_serves_and_leaves_the_process_as_it_was() -> None:
    """`testing.in_process()`: the daemon answers on its real socket, runs a job on a worker
    process and traces it; stopped, it drained (exit 0), removed its socket, its workers are
    gone, and the test process has the threads, descriptors, umask, signal handlers,
    environment, frozen objects and children it had before."""
    multiprocessing.resource_tracker.ensure_running()  # the first spawn's, kept for the process
    with asyncio.Runner(loop_factory=loop_factory()) as runner:  # uvloop's pipe, once a process
        runner.run(asyncio.sleep(0))
    gc.collect()  # an earlier test's garbage (a socket) is not closed by the stop's collect
    before = process_wide()
    with in_process() as daemon:
        with daemon.client() as client:
            job = client.run("noop", {})
            workers = [w["pid"] for w in client.status()["workers"]]
        assert job["status"] == "succeeded", job
        assert daemon.wait_for_event(lambda e: e.get("job_id") == job["id"])["event"]
        running = daemon.events("job.succeeded")
        assert [e["job_id"] for e in running] == [job["id"]]
        assert threading.active_count() > len(before["threads"])  # its loop's thread
    assert daemon.stop() == 0
    assert not daemon.socket_path.exists()
    assert len(workers) == 2 and not any(map(alive, workers)), workers
    assert process_wide() == before


def test_an_in_process_start_that_fails_says_why_and_frees_the_next(
    daemon_factory: Callable[..., RunningDaemon],
) -> None:
    """A start refused on a state directory a daemon process holds raises HarnessError with
    the daemon's reason; the next in-process daemon then starts (the first let go of it all)."""
    held = daemon_factory()
    home = held.home.parent / "second"
    home.mkdir()
    (home / "state").symlink_to(held.state_dir)  # its own socket, the held state directory
    with pytest.raises(HarnessError, match="StateDirLocked"):
        start_in_process(home)
    with in_process() as daemon:
        assert daemon.healthy()


def test_one_in_process_daemon_at_a_time(inprocess_daemon: InProcessDaemon) -> None:
    """Logging is the process's: a second in-process daemon while one runs is refused."""
    with pytest.raises(HarnessError, match="one in-process daemon at a time"):
        start_in_process(new_home())
    assert inprocess_daemon.healthy()


HARNESS_NAMES = {name for name in vars(sys.modules["taogpud.testing"]) if name[0] != "_"}


def harness_imports_elsewhere(source: str) -> list[str]:
    """The imports in `source` that reach the harness another way than
    `from taogpud.testing import NAME`: `from taogpud import testing`, `import
    taogpud.testing`, or a harness name taken from conftest or from another test module."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and "taogpud.testing" in [a.name for a in node.names]:
            found.append(f"line {node.lineno}: import taogpud.testing")
        if not isinstance(node, ast.ImportFrom) or node.level:
            continue
        module, names = node.module or "", [alias.name for alias in node.names]
        if module == "taogpud" and "testing" in names:
            found.append(f"line {node.lineno}: from taogpud import testing")
        elif module.split(".")[-1].startswith(("conftest", "test_")):
            borrowed = sorted(set(names) & HARNESS_NAMES)
            found += [f"line {node.lineno}: {name} from {module}" for name in borrowed]
    return found


def test_tests_import_the_harness_one_way() -> None:
    """Every test module takes the harness `from taogpud.testing import …`, and the check
    itself finds each of the other ways (the three that were in use)."""
    tests = Path(__file__).parent
    elsewhere = {
        path.name: found
        for path in sorted(tests.glob("*.py"))
        if (found := harness_imports_elsewhere(path.read_text()))
    }
    assert elsewhere == {}
    other_ways = (
        "from taogpud import testing\n"
        "from conftest import RunningDaemon\n"
        "from tests.conftest import start_daemon\n"
        "from tests.test_cli import Ctl, json_out\n"
        "import taogpud.testing\n"
    )
    assert len(harness_imports_elsewhere(other_ways)) == 5


def test_a_modules_shared_in_process_daemon_gives_way_to_a_test_of_its_own(
    shared_inprocess: Any, inprocess_factory: Callable[..., InProcessDaemon]
) -> None:
    """tests/conftest.py's module_inprocess_daemon: the same daemon to each sharer; a test
    that starts one of its own stops the shared one first (one runs at a time), and the next
    sharer starts another."""
    first = shared_inprocess.get()
    assert shared_inprocess.get() is first and first.healthy()
    own = inprocess_factory()
    assert own.healthy() and not first.healthy()
    assert shared_inprocess.daemon is None  # the next get() starts a new one
