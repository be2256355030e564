"""Time from saving config.toml (an editor's rename-save) to the new generation being live.

Polls GET /v1/status every 2 ms for the new max_concurrent_tasks, so the figure
includes the watcher's quiet period, the reload itself and one poll.

    python bench/reload_latency.py [--saves 20]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from conftest import CPU_CONFIG, deep_merge, start_daemon, to_toml  # noqa: E402

from taogpud.client import Client  # noqa: E402


def save(path: Path, cap: int) -> None:
    temporary = path.with_name(".config.toml.swp")
    temporary.write_text(
        to_toml(deep_merge(CPU_CONFIG, {"scheduling": {"max_concurrent_tasks": cap}}))
    )
    temporary.rename(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    home = Path(tempfile.mkdtemp(prefix="tgd-reload-", dir="/tmp"))
    daemon = start_daemon(home, None, None)
    samples_ms = []
    try:
        with Client(daemon.socket_path) as client:
            for n in range(args.saves):
                cap = 2 + n % 5  # 2..6, never the 8 it starts with, never twice in a row
                started = time.perf_counter()
                save(daemon.config_path, cap)
                while client.status()["max_concurrent_tasks"] != cap:
                    time.sleep(0.002)
                samples_ms.append((time.perf_counter() - started) * 1e3)
                time.sleep(0.2)
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
    print(
        f"save → live over {len(samples_ms)} saves: median {statistics.median(samples_ms):.0f} ms, "
        f"min {min(samples_ms):.0f} ms, max {max(samples_ms):.0f} ms"
    )


if __name__ == "__main__":
    main()
