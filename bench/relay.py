"""The relay's added latency and throughput against the fake provider called directly, and
beside LiteLLM's proxy in front of the same provider when one is given.

    python -m bench.relay [--n N] [--litellm PATH/TO/litellm]      (from the repository's root)

p50 of N small non-streaming chat completions (one keep-alive http.client connection),
time to first byte of a streaming one (the first byte of its first event), and requests/s
with 8 client threads; each direct to the fake provider (taogpud/testing/fake_provider.py), through
the relay's TCP listener, and through LiteLLM's proxy (`litellm[proxy]` installed in a venv
of its own; its `litellm` command is passed with --litellm). All rows in one run, one after
another, against the same provider.

Then streaming chat completions at 1, 8 and 64 concurrent clients (each its own kept-alive
connection, about CONCURRENT_REQUESTS requests a level): p50 and p99 of the whole answer and
of its first byte and the level's requests/s, direct and through each proxy, what the proxy
added at each percentile (the proxy's figure less the direct one of the same level, same
run), and the relay's requests/s over LiteLLM's at each level.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import secrets
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from taogpud.testing import running
from taogpud.testing.fake_provider import (
    FakeProvider,
    Reply,
    closed_port,
    fake_provider,
    openai_stream,
)

KEY = "sk-bench-" + "0" * 24
BODY = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}]})
STREAM_BODY = json.dumps(
    {"model": "default", "stream": True, "messages": [{"role": "user", "content": "hi"}]}
)
LITELLM_START_S = 120.0
LEVELS = (1, 8, 64)  # concurrent streaming clients
CONCURRENT_REQUESTS = 640  # per level, shared among its clients


@dataclass(frozen=True)
class Target:
    name: str
    host: str  # the Host header: the relay refuses any other
    port: int
    path: str
    token: str


def one(conn: http.client.HTTPConnection, target: Target, body: str) -> tuple[float, float]:
    """(total s, first byte s) of one request on a kept-alive connection."""
    started = time.perf_counter()
    headers = {
        "Host": target.host,
        "Authorization": f"Bearer {target.token}",
        "Content-Type": "application/json",
    }
    conn.request("POST", target.path, body, headers)
    response = conn.getresponse()
    first = response.read(1)
    ttfb = time.perf_counter() - started
    response.read()
    assert first and response.status == 200, response.status
    return time.perf_counter() - started, ttfb


def latency(target: Target, n: int, body: str) -> tuple[float, float]:
    conn = http.client.HTTPConnection("127.0.0.1", target.port)
    for _ in range(20):
        one(conn, target, body)
    samples = [one(conn, target, body) for _ in range(n)]
    conn.close()
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def throughput(target: Target, seconds: float = 3.0) -> float:
    done = [0] * 8
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", target.port)
        while time.monotonic() < stop:
            one(conn, target, BODY)
            done[index] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


@dataclass(frozen=True)
class Spread:
    """p50 and p99 of the whole answer and of its first byte, in seconds; the level's
    requests/s (its requests over the wall time from the start barrier to the last answer)."""

    p50: float
    p99: float
    ttfb_p50: float
    ttfb_p99: float
    rps: float


def concurrent_streams(target: Target, clients: int) -> Spread:
    """`clients` threads, each on its own connection, stream until the level's requests are
    done; every request's (total, first byte) kept."""
    per_client = max(3, CONCURRENT_REQUESTS // clients)
    samples: list[tuple[float, float]] = []
    lock = threading.Lock()
    start = threading.Barrier(clients)

    def client(conn: http.client.HTTPConnection) -> None:
        start.wait()
        mine = [one(conn, target, STREAM_BODY) for _ in range(per_client)]
        conn.close()
        with lock:
            samples.extend(mine)

    connections = [http.client.HTTPConnection("127.0.0.1", target.port) for _ in range(clients)]
    for conn in connections:  # connected one by one, before the clock starts
        one(conn, target, STREAM_BODY)
    threads = [threading.Thread(target=client, args=(conn,)) for conn in connections]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    rps = len(samples) / (time.perf_counter() - started)
    totals = sorted(s[0] for s in samples)
    firsts = sorted(s[1] for s in samples)
    return Spread(_pct(totals, 50), _pct(totals, 99), _pct(firsts, 50), _pct(firsts, 99), rps)


def _pct(ordered: list[float], pct: int) -> float:
    return ordered[min(len(ordered) - 1, round(pct / 100 * (len(ordered) - 1)))]


def levels(provider: FakeProvider, target: Target) -> dict[int, Spread]:
    provider.default = Reply(events=openai_stream("m", words=3))
    spreads = {clients: concurrent_streams(target, clients) for clients in LEVELS}
    provider.default = Reply()
    return spreads


def measure(provider: FakeProvider, target: Target, n: int) -> tuple[float, float, float]:
    provider.default = Reply()
    p50, _ = latency(target, n, BODY)
    provider.default = Reply(events=openai_stream("m", words=3))
    _, ttfb = latency(target, n // 3, STREAM_BODY)
    provider.default = Reply()
    return p50, ttfb, throughput(target)


@contextlib.contextmanager
def litellm_proxy(command: str, provider: FakeProvider, home: Path) -> Iterator[Target]:
    """LiteLLM's proxy, one worker, as it ships, with one model in front of the provider."""
    port = closed_port()
    master = "sk-litellm-" + secrets.token_hex(16)
    config = home / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: default\n"
        "    litellm_params:\n"
        "      model: openai/claude-sonnet\n"
        f"      api_base: {provider.base_url}/v1\n"
        f"      api_key: {KEY}\n"
        "general_settings:\n"
        f"  master_key: {master}\n"
    )
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # no fetch at start
    argv = [command, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)]
    with (home / "litellm.log").open("wb") as log:
        proc = subprocess.Popen([*argv, "--num_workers", "1"], stdout=log, stderr=log, env=env)
    try:
        _wait_up(port, proc)
        yield Target("litellm", f"127.0.0.1:{port}", port, "/v1/chat/completions", master)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def _wait_up(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + LITELLM_START_S
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health/liveliness")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.5)
    raise RuntimeError("LiteLLM's proxy did not come up (see litellm.log in the bench's home)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=300, help="requests for the p50")
    parser.add_argument("--litellm", help="the `litellm` command of a litellm[proxy] install")
    args = parser.parse_args()
    with fake_provider(KEY) as provider:
        base = provider.base_url
        settings = {"provider": {"baseUrl": base}, "logging": {"requestTrace": True}}
        config = {"api": {"base_url": base}, "relay": {"enabled": True, "listen": "127.0.0.1:0"}}
        env = {"TAOTOKEN_API_KEY": KEY}
        with running(settings, config, env, prefix="tgd-bench-") as daemon:
            with daemon.client() as client:
                answer = client.relay_token()
            relay_port = int(answer["listen"].rsplit(":", 1)[1])
            direct = f"127.0.0.1:{provider.port}"
            targets = [
                Target("direct", direct, provider.port, "/api/v1/chat/completions", KEY),
                Target(
                    "relay", answer["listen"], relay_port, "/v1/chat/completions", answer["token"]
                ),
            ]
            rows = {t.name: measure(provider, t, args.n) for t in targets}
            spreads = {t.name: levels(provider, t) for t in targets}
            if args.litellm:
                with litellm_proxy(args.litellm, provider, daemon.home) as target:
                    rows["litellm"] = measure(provider, target, args.n)
                    spreads["litellm"] = levels(provider, target)
    report(rows)
    report_levels(spreads)


def report_levels(spreads: dict[str, dict[int, Spread]]) -> None:
    print("streaming, concurrent clients (ms): p50 / p99 of the answer, of its first byte")
    for name, by_level in spreads.items():
        for clients, s in by_level.items():
            print(
                f"{name:7} {clients:3} clients  answer {s.p50 * 1e3:7.3f} / {s.p99 * 1e3:7.3f}"
                f"  TTFB {s.ttfb_p50 * 1e3:7.3f} / {s.ttfb_p99 * 1e3:7.3f}  {s.rps:7.0f} req/s"
            )
    direct = spreads["direct"]
    for name in (n for n in spreads if n != "direct"):
        for clients, s in spreads[name].items():
            d = direct[clients]
            print(
                f"{name} added at {clients:3} clients: p50 {(s.p50 - d.p50) * 1e3:7.3f} ms, "
                f"p99 {(s.p99 - d.p99) * 1e3:7.3f} ms, TTFB p50 "
                f"{(s.ttfb_p50 - d.ttfb_p50) * 1e3:7.3f} ms, "
                f"p99 {(s.ttfb_p99 - d.ttfb_p99) * 1e3:7.3f} ms"
            )
    if "litellm" in spreads:
        for clients, s in spreads["relay"].items():
            ratio = s.rps / spreads["litellm"][clients].rps
            print(f"relay/litellm streaming requests/s at {clients:3} clients: {ratio:.1f}x")


def report(rows: dict[str, tuple[float, float, float]]) -> None:
    for name, (p50, ttfb, rps) in rows.items():
        print(
            f"{name:7} p50 {p50 * 1e3:7.3f} ms  stream TTFB {ttfb * 1e3:7.3f} ms  "
            f"8 clients {rps:7.0f} req/s"
        )
    d = rows["direct"]
    for name in ("relay", "litellm"):
        if name in rows:
            r = rows[name]
            print(
                f"{name} added: p50 {(r[0] - d[0]) * 1e3:.3f} ms, TTFB {(r[1] - d[1]) * 1e3:.3f} ms"
            )
    if "litellm" in rows:
        print(
            f"relay/litellm requests/s with 8 clients: {rows['relay'][2] / rows['litellm'][2]:.1f}x"
        )


if __name__ == "__main__":
    main()
