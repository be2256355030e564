"""Tiny-job dispatch: noop jobs submit → result through the public Python client.

One run, one host, side by side: a bare asyncio Unix-socket echo of the same
request bytes (the floor), taogpud with 1 client sequential, and taogpud with 8
concurrent client processes. Prints a markdown table and writes it to
bench/results/dispatch.md. Also says where a job's time goes, from the daemon's
own traces (request duration in the server, queue and run time in the worker).

    python bench/dispatch.py [--jobs 3000] [--clients 8]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import shutil
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
sys.path.insert(0, str(REPO))

from conftest import RunningDaemon, start_daemon  # noqa: E402

from taogpud.client import Client  # noqa: E402

RESULTS = REPO / "bench" / "results"
SUBMIT_BODY = json.dumps({"task": "noop", "params": {}}).encode()
REQUEST = (
    b"POST /v1/jobs?wait_s=30 HTTP/1.1\r\nhost: taogpud\r\ncontent-type: application/json\r\n"
    + f"content-length: {len(SUBMIT_BODY)}\r\n\r\n".encode()
    + SUBMIT_BODY
)


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarise(name: str, latencies_s: list[float], wall_s: float) -> dict[str, Any]:
    return {
        "name": name,
        "jobs": len(latencies_s),
        "jobs_per_s": len(latencies_s) / wall_s,
        "p50_ms": percentile(latencies_s, 0.50) * 1e3,
        "p99_ms": percentile(latencies_s, 0.99) * 1e3,
    }


# -- the floor: a bare asyncio echo over a Unix socket ------------------------------------


def echo_server(path: str, ready: Any) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()

    async def main() -> None:
        server = await asyncio.start_unix_server(handle, path)
        ready.set()
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def bench_echo(count: int) -> dict[str, Any]:
    path = tempfile.mktemp(prefix="tgd-echo-", dir="/tmp")
    ready = multiprocessing.get_context("spawn").Event()
    server = multiprocessing.get_context("spawn").Process(
        target=echo_server, args=(path, ready), daemon=True
    )
    server.start()
    ready.wait(10)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    latencies = []
    started = time.perf_counter()
    for _ in range(count):
        t0 = time.perf_counter()
        sock.sendall(REQUEST)
        received = 0
        while received < len(REQUEST):
            received += len(sock.recv(65536))
        latencies.append(time.perf_counter() - t0)
    wall = time.perf_counter() - started
    sock.close()
    server.kill()
    Path(path).unlink(missing_ok=True)
    return summarise("bare asyncio Unix-socket echo, same request bytes (floor)", latencies, wall)


# -- taogpud ------------------------------------------------------------------------------


def run_jobs(socket_path: str, count: int) -> list[float]:
    latencies = []
    with Client(socket_path) as client:
        for _ in range(count):
            t0 = time.perf_counter()
            job = client.submit("noop", wait_s=30)
            latencies.append(time.perf_counter() - t0)
            if job["status"] != "succeeded":
                raise RuntimeError(f"noop job did not succeed: {job}")
    return latencies


def bench_sequential(daemon: RunningDaemon, count: int) -> dict[str, Any]:
    run_jobs(str(daemon.socket_path), 200)  # warm the connection and the code paths
    started = time.perf_counter()
    latencies = run_jobs(str(daemon.socket_path), count)
    return summarise("taogpud, 1 client sequential", latencies, time.perf_counter() - started)


def bench_concurrent(daemon: RunningDaemon, count: int, clients: int) -> dict[str, Any]:
    per_client = count // clients
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(clients) as pool:
        pool.starmap(run_jobs, [(str(daemon.socket_path), 50)] * clients)  # warm-up
        started = time.perf_counter()
        results = pool.starmap(run_jobs, [(str(daemon.socket_path), per_client)] * clients)
        wall = time.perf_counter() - started
    latencies = [sample for result in results for sample in result]
    return summarise(f"taogpud, {clients} concurrent clients", latencies, wall)


def where_time_goes(daemon: RunningDaemon) -> dict[str, float]:
    requests = [
        e["duration_ms"] for e in daemon.events("api.request") if e.get("path") == "/v1/jobs"
    ]
    done = daemon.events("job.succeeded")
    return {
        "server_request_p50_ms": statistics.median(requests) if requests else float("nan"),
        "queue_p50_ms": statistics.median(e["queue_ms"] for e in done),
        "worker_run_p50_ms": statistics.median(e["run_ms"] for e in done),
    }


def host_line() -> str:
    cpu = platform.processor() or platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    system = f"{platform.system()} {platform.release()}"
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, {system}"


def render(rows: list[dict[str, Any]], breakdown: dict[str, float], floor: dict[str, Any]) -> str:
    lines = [
        "# Tiny-job dispatch (noop, submit → result through the Python client)",
        "",
        f"Host: {host_line()}. Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}.",
        "",
        "| what | jobs | jobs/s | p50 ms | p99 ms | p50 vs floor |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = row["p50_ms"] / floor["p50_ms"]
        lines.append(
            f"| {row['name']} | {row['jobs']} | {row['jobs_per_s']:,.0f} | {row['p50_ms']:.3f} "
            f"| {row['p99_ms']:.3f} | {ratio:.1f}× |"
        )
    lines += [
        "",
        "Where a sequential job's time goes (medians, from the daemon's own traces):",
        f"- in the API server, request in → response out: "
        f"{breakdown['server_request_p50_ms']:.3f} ms",
        f"- of which queued before a slot: {breakdown['queue_p50_ms']:.3f} ms",
        f"- of which the task in the worker (from order to result): "
        f"{breakdown['worker_run_p50_ms']:.3f} ms",
        "- the rest of the client's round trip is the client itself and the socket",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=3000)
    parser.add_argument("--clients", type=int, default=8)
    args = parser.parse_args()
    floor = bench_echo(args.jobs)
    home = Path(tempfile.mkdtemp(prefix="tgd-bench-", dir="/tmp"))
    daemon = start_daemon(home, None, {"scheduling": {"max_concurrent_tasks": 8}})
    try:
        sequential = bench_sequential(daemon, args.jobs)
        breakdown = where_time_goes(daemon)
        concurrent = bench_concurrent(daemon, args.jobs, args.clients)
    finally:
        daemon.stop()
        shutil.rmtree(home, ignore_errors=True)
    report = render([floor, sequential, concurrent], breakdown, floor)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "dispatch.md").write_text(report)
    print(report)


if __name__ == "__main__":
    main()
