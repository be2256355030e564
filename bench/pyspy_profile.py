"""py-spy: record a process (and its children) as raw stacks, then say where the time goes.

`py-spy record -f raw` writes one line per distinct stack: `frame;frame;... count`, each
frame `function (file:line)`, and with --subprocesses a `process PID:"cmdline"` frame on top
of each process. Idle threads are left out, so shares are of the time a process was busy.

Groups: each sample goes to the group of the innermost frame that belongs to one (walking
out from the leaf), so a JSON encoder called by structlog counts as logging, and the groups
add up to 100%. Top frames: each function's inclusive share (on the stack at all), leaving
out pass-through frames (one callee, never the leaf: a middleware chain shows once, at its
end). Hot lines: the leaf frames, where the samples landed (a C call shows as its caller).
"""

from __future__ import annotations

import itertools
import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

OTHER = "other"
# watchfiles waits in Rust on an anyio worker thread, waking every 50 ms; py-spy samples that
# thread as busy whenever it is runnable (/proc puts the idle daemon near 0% CPU). Left out.
WATCHER = "config watcher thread (a wait)"
# Ordered: the first group whose marker is in a frame's file wins for that frame.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "logging and traces",
        ("/structlog/", "/taogpud/observability/logging.py", "/taogpud/observability/trace.py",
         "/taogpud/observability/journal.py", "/logging/__init__.py"),
    ),
    ("job store (SQLite)", ("/taogpud/jobs/store.py", "/taogpud/jobs/wal.py", "/sqlite3/")),
    (
        "worker pipe",
        ("/taogpud/pool/worker.py", "/taogpud/pool/protocol.py", "/taogpud/pool/supervisor.py",
         "/multiprocessing/connection.py"),
    ),
    ("arrays (shared memory)", ("/taogpud/arrayfiles/",)),
    (
        "worker process: task, backend",
        ("/taogpud/pool/", "/taogpud/backends/", "/taogpud/tasks/", "/concurrent/futures/"),
    ),
    ("numpy (arrays)", ("/numpy/",)),
    (WATCHER, ("/watchfiles/", "/anyio/_backends/")),
    ("pydantic (models, JSON)", ("/pydantic/", "/pydantic_core/")),
    ("framework (FastAPI, Starlette, anyio)", ("/fastapi/", "/starlette/", "/anyio/")),
    ("HTTP server (uvicorn, httptools)", ("/uvicorn/", "/httptools/", "/h11/")),
    ("our API handlers", ("/taogpud/api/",)),
    (
        "client (taogpud.client, http.client)",
        ("/taogpud/client/__init__.py", "/http/client.py", "/socket.py", "/email/"),
    ),
    ("scheduler and jobs", ("/taogpud/",)),
    ("benchmark load loop", ("/bench/", "/multiprocessing/synchronize.py")),
    ("event loop (uvloop, in C)", ("/asyncio/", "/uvloop/", "/selectors.py")),
)  # fmt: skip
FRAME = re.compile(r"^(?P<function>.*) \((?P<file>.*):(?P<line>\d+)\)$")
LIBRARY = re.compile(r"^.*/(?:site-packages|lib/python3\.\d+)/")
ROOT_SHARE = 0.9  # frames on (nearly) every stack say nothing: main(), Runner.run, ...


@dataclass(frozen=True)
class Frame:
    function: str
    file: str

    @property
    def label(self) -> str:
        return f"{self.function} ({short_path(self.file)})"

    @property
    def group(self) -> str | None:
        for name, markers in GROUPS:
            if any(marker in self.file for marker in markers):
                return name
        return None


class Stack(NamedTuple):
    frames: list[Frame]  # outermost first
    leaf_line: str
    count: int


@dataclass(frozen=True)
class ProcessProfile:
    """One process's busy samples: shares by group (adding to 1) and the top frames."""

    samples: int
    left_out: int  # samples of the config watcher's wait
    groups: dict[str, float]
    top: list[tuple[str, str, float]]  # (frame, its group, inclusive share)
    hot: list[tuple[str, str, float]]  # (leaf frame with its line, its group, share)


def py_spy() -> Path | None:
    beside = Path(sys.executable).parent / "py-spy"
    found = beside if beside.exists() else shutil.which("py-spy")
    return Path(found) if found else None


def recorder(pid: int, out: Path, rate_hz: int, children: bool) -> subprocess.Popen[bytes]:
    """Start sampling `pid` into `out` (raw stacks) until `stop`."""
    binary = py_spy()
    if binary is None:
        raise RuntimeError("py-spy is not installed: pip install -e '.[bench]'")
    command = [
        str(binary), "record", "--pid", str(pid), "--rate", str(rate_hz), "--format", "raw",
        "--full-filenames", "--output", str(out),
    ]  # fmt: skip
    if children:
        command.append("--subprocesses")
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def stop(recorders: list[subprocess.Popen[bytes]]) -> None:
    """Ctrl-C each recorder: py-spy then writes what it sampled."""
    for recorder in recorders:
        recorder.send_signal(signal.SIGINT)
    for recorder in recorders:
        _, error = recorder.communicate(timeout=60)
        if recorder.returncode != 0:
            raise RuntimeError(f"py-spy failed: {error.decode(errors='replace')[-500:]}")


def load(raw: Path, top_n: int = 15) -> dict[str, ProcessProfile]:
    """Per process: "main" for the recorded pid, "children" for all its children together."""
    stacks: dict[str, list[Stack]] = {"main": [], "children": []}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        names = stack.split(";")
        processes = sum(1 for name in names if name.startswith("process "))
        parsed = [found for name in names if (found := FRAME.match(name)) is not None]
        frames = [Frame(match["function"], match["file"]) for match in parsed]
        leaf_line = parsed[-1]["line"] if parsed else ""
        stacks["children" if processes > 1 else "main"].append(Stack(frames, leaf_line, int(count)))
    return {who: _summarise(found, top_n) for who, found in stacks.items() if found}


def _summarise(found: list[Stack], top_n: int) -> ProcessProfile:
    stacks = [stack for stack in found if _owner(stack.frames) != WATCHER]
    total = sum(stack.count for stack in stacks)
    left_out = sum(stack.count for stack in found) - total
    groups: Counter[str] = Counter()
    inclusive: Counter[Frame] = Counter()
    hot: Counter[tuple[Frame, str]] = Counter()
    callees: dict[Frame, set[Frame]] = {}
    leaves: set[Frame] = set()
    for frames, leaf_line, count in stacks:
        groups[_owner(frames)] += count
        for frame in set(frames):
            inclusive[frame] += count
        for caller, callee in itertools.pairwise(frames):
            callees.setdefault(caller, set()).add(callee)
        if frames:
            leaves.add(frames[-1])
            hot[frames[-1], leaf_line] += count
    top = [
        (frame.label, frame.group or OTHER, count / total)
        for frame, count in inclusive.most_common()
        if count / total < ROOT_SHARE and (frame in leaves or len(callees.get(frame, ())) > 1)
    ]
    hottest = [
        (f"{frame.function} ({short_path(frame.file)}:{line})", frame.group or OTHER, n / total)
        for (frame, line), n in hot.most_common(top_n)
    ]
    shares = {name: count / total for name, count in groups.most_common()}
    return ProcessProfile(total, left_out, shares, top[:top_n], hottest)


def _owner(frames: list[Frame]) -> str:
    """The group of the innermost frame that has one (frames run outermost → leaf)."""
    for frame in reversed(frames):
        if (group := frame.group) is not None:
            return group
    return OTHER


def short_path(path: str) -> str:
    """From the package on: site-packages/, the stdlib folder and the checkout are cut off."""
    stripped = LIBRARY.sub("", path)
    if stripped != path:
        return stripped
    for package in ("taogpud/", "bench/", "tests/"):
        at = path.rfind("/" + package)
        if at >= 0:
            return path[at + 1 :]
    return path
