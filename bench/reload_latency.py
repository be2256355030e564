"""Time from saving config.toml (an editor's rename-save) to the new generation being live.

Polls GET /v1/status every 2 ms for the new max_concurrent_tasks, so the figure
includes the watcher's quiet period, the reload itself and one poll.

    python -m bench.reload_latency [--saves 20]      (from the repository's root)
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from taogpud.testing import cpu_pair, running, to_toml, write_text


def save(path: Path, cap: int) -> None:
    """config.toml with this cap, saved as an editor saves (a rename)."""
    _, config = cpu_pair(config={"scheduling": {"max_concurrent_tasks": cap}})
    write_text(path, to_toml(config), atomic=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--saves", type=int, default=20)
    args = parser.parse_args()
    samples_ms = []
    with running(prefix="tgd-reload-") as daemon, daemon.client() as client:
        for n in range(args.saves):
            cap = 2 + n % 5  # 2..6, never the 8 it starts with, never twice in a row
            started = time.perf_counter()
            save(daemon.config_path, cap)
            while client.status()["max_concurrent_tasks"] != cap:
                time.sleep(0.002)
            samples_ms.append((time.perf_counter() - started) * 1e3)
            time.sleep(0.2)
    print(
        f"save → live over {len(samples_ms)} saves: median {statistics.median(samples_ms):.0f} ms, "
        f"min {min(samples_ms):.0f} ms, max {max(samples_ms):.0f} ms"
    )


if __name__ == "__main__":
    main()
