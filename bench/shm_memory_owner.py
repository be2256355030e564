"""Whose memory a client's shared arrays are: each side's memory cgroup charge, against RSS.

    python -m bench.shm_memory_owner [--mib 128] [--raw]     (as root: it makes two cgroups)

The daemon and its workers go in one memory cgroup, a client in another. The client makes
two untouched `client.empty` arrays of `--mib` MiB each and runs vector_add into an output
span of the same size; then each group's shmem charge and each process's RSS are printed.
RSS counts a shared page in every process that maps and touches it, so the worker's RSS
shows the client's pages; the cgroup charge says who allocated them. `--raw`: the client
skips allocating its pages, as a client of the wire protocol may; the daemon refuses that
job (region_not_allocated), where before the worker allocated them, charged to the daemon.
Cgroup v1 (`/sys/fs/cgroup/memory`) or v2 (`/sys/fs/cgroup`, memory controller on).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from taogpud.testing import running

V1 = Path("/sys/fs/cgroup/memory")
V2 = Path("/sys/fs/cgroup")


def new_group(name: str) -> Path:
    group = (V1 if V1.is_dir() else V2) / name
    group.mkdir(exist_ok=True)
    return group


def charge_mib(group: Path) -> dict[str, int]:
    """All the group is charged, and the shmem of it, in MiB."""
    stat = dict(line.split() for line in (group / "memory.stat").read_text().splitlines())
    usage = group / ("memory.usage_in_bytes" if group.parent == V1 else "memory.current")
    return {"all": int(usage.read_text()) >> 20, "shmem": int(stat.get("shmem", 0)) >> 20}


def rss_kib(pid: int | str) -> dict[str, int]:
    """VmRSS and its shared-memory part (RssShmem), in KiB."""
    fields = (line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines())
    wanted = ("VmRSS", "RssShmem")
    return {key: int(value.split()[0]) for key, value in fields if key in wanted}


def client(group: str, socket_path: str, mib: int, raw: bool) -> None:
    """The client side: in its group before it allocates anything; holds until stdin ends."""
    Path(group, "cgroup.procs").write_text(str(os.getpid()))
    from taogpud.client import ApiError, Client
    from taogpud.memfd import client as client_shm

    if raw:  # a client that never allocates what it hands over
        client_shm.Arena._populate = lambda self, offset, length: None  # type: ignore[method-assign]
    count = (mib << 20) // 4
    with Client(socket_path, timeout_s=300) as connection:
        a, b = connection.empty(count, "float32"), connection.empty(count, "float32")
        try:
            connection.compute("vector_add", a=a, b=b, out_bytes=mib << 20)
            outcome = "succeeded"
        except ApiError as exc:
            outcome = exc.code
        print(json.dumps({"outcome": outcome, "rss_kib": rss_kib("self")}), flush=True)
        sys.stdin.read()


def measure(mib: int, raw: bool) -> dict[str, Any]:
    daemon_group, client_group = new_group("tgd-owner-daemon"), new_group("tgd-owner-client")
    try:
        with running(prefix="tgd-owner-") as daemon, daemon.client() as connection:
            workers = [w["pid"] for w in connection.status()["workers"]]
            for pid in (daemon.proc.pid, *workers):
                (daemon_group / "cgroup.procs").write_text(str(pid))
            argv = [sys.executable, "-m", "bench.shm_memory_owner", "--client", str(client_group)]
            argv += [str(daemon.socket_path), "--mib", str(mib), *(["--raw"] if raw else [])]
            with subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE) as child:
                assert child.stdout is not None and child.stdin is not None
                seen = json.loads(child.stdout.readline())
                seen["daemon_group_mib"], seen["client_group_mib"] = map(
                    charge_mib, (daemon_group, client_group)
                )
                seen["workers_rss_kib"] = [rss_kib(pid) for pid in workers]
                child.stdin.close()
        return seen
    finally:
        remove(daemon_group, client_group)


def remove(*groups: Path) -> None:
    """The groups, once the processes in them are gone (their pages' charges go with them)."""
    for group in groups:
        for _ in range(100):
            try:
                group.rmdir()
                break
            except OSError:
                time.sleep(0.1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--raw", action="store_true")
    parser.add_argument("--client", nargs=2, metavar=("GROUP", "SOCKET"))
    args = parser.parse_args()
    if args.client:
        client(*args.client, args.mib, args.raw)
    else:
        print(json.dumps(measure(args.mib, args.raw), indent=1))


if __name__ == "__main__":
    main()
