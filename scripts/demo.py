"""The main job, end to end: start taogpud, run vector_add, show where it ran, stop.

It runs the daemon on the embedded defaults (the setup guide's seed: CUDA on GPU 0)
when this host can run CUDA, and otherwise on the guide's pair switched to the CPU
(packaging/examples/cpu), saying so: a GPU-less host never falls back silently.

    python scripts/demo.py
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CPU_PAIR = REPO / "packaging" / "examples" / "cpu"
READY_TIMEOUT_S = 120


def config_flags() -> list[str]:
    reason = why_no_cuda()
    if reason is None:
        print("CUDA is available: running on the embedded defaults (backend cuda, GPU 0).")
        return []
    print(f"No usable GPU here: {reason}")
    print(f"-> running on the CPU pair in {CPU_PAIR.relative_to(REPO)} instead.\n")
    return [
        "--settings",
        str(CPU_PAIR / "settings.json"),
        "--config",
        str(CPU_PAIR / "config.toml"),
    ]


def why_no_cuda() -> str | None:
    """Why CUDA cannot run here, the driver asked first: a host without one hears that, not
    what the venv lacks (`make demo` installs no CuPy there: it blamed "CuPy is not
    installed", which no install would fix)."""
    from taogpud.backends.cuda.backend import driver_installed, probe_cuda

    if not driver_installed():
        return "no NVIDIA driver (no /proc/driver/nvidia, no nvidia-smi)"
    return probe_cuda([0])


def wait_ready(daemon: subprocess.Popen[bytes], socket_path: Path) -> None:
    from taogpud.client import Client

    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if daemon.poll() is not None:
            sys.exit(f"taogpud exited with status {daemon.returncode}")
        if socket_path.exists():
            with Client(socket_path) as client:
                if client.health()["ok"]:
                    return
        time.sleep(0.05)
    sys.exit("taogpud was not ready in time")


def main() -> int:
    home = Path(tempfile.mkdtemp(prefix="taogpud-demo-", dir="/tmp"))
    try:
        return run_in(home)
    finally:
        shutil.rmtree(home, ignore_errors=True)  # the state, the socket and the log


def run_in(home: Path) -> int:
    socket_path, log_path = home / "taogpud.sock", home / "taogpud.log"
    command = [
        sys.executable,
        "-m",
        "taogpud",
        *config_flags(),
        "--socket",
        str(socket_path),
        "--state-dir",
        str(home),
    ]
    with log_path.open("wb") as log:
        daemon = subprocess.Popen(command, stdout=log)
    try:
        wait_ready(daemon, socket_path)
        print("$ taogpuctl submit vector_add --size 1000000 --wait")
        ctl = [sys.executable, "-m", "taogpud.cli", "--socket", str(socket_path)]
        subprocess.run([*ctl, "submit", "vector_add", "--size", "1000000", "--wait"], check=True)
        listed = subprocess.run(
            [*ctl, "list", "--limit", "1", "--json"], capture_output=True, check=True
        )
        job = json.loads(listed.stdout)[0]
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(60)
    # This daemon's stdout, not the journal's: what `taogpuctl trace --grep ID` reads from a
    # running daemon (a journalctl command here showed nothing: no service ran the demo).
    print(f"\nThe trace of job {job['id']} (the daemon's JSON lines for it, from its stdout):")
    for line in log_path.read_text().splitlines():
        if job["id"] in line:
            print(line)
    print(f"\ntaogpud stopped with status {daemon.returncode}")
    return 0 if job["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main())
