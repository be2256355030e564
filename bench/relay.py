"""The relay's added latency and throughput against the fake provider called directly.

    PYTHONPATH=. python bench/relay.py [N]

p50 of N small non-streaming chat completions (one keep-alive http.client connection),
time to first byte of a streaming one, and requests/s with 8 client threads; each direct to
the fake provider (tests/fake_provider.py) and through the relay's TCP listener.
"""

from __future__ import annotations

import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from conftest import start_daemon
from fake_provider import Reply, fake_provider, openai_stream

KEY = "sk-bench-" + "0" * 24
BODY = json.dumps({"model": "default", "messages": [{"role": "user", "content": "hi"}]})


def one(conn: http.client.HTTPConnection, host: str, path: str, token: str) -> tuple[float, float]:
    """(total s, first byte s) of one request on a kept-alive connection."""
    started = time.perf_counter()
    headers = {"Host": host, "Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    conn.request("POST", path, BODY, headers)
    response = conn.getresponse()
    first = response.read(1)
    ttfb = time.perf_counter() - started
    response.read()
    assert first and response.status == 200, response.status
    return time.perf_counter() - started, ttfb


def latency(host: str, port: int, path: str, token: str, n: int) -> tuple[float, float]:
    conn = http.client.HTTPConnection("127.0.0.1", port)
    for _ in range(20):
        one(conn, host, path, token)
    samples = [one(conn, host, path, token) for _ in range(n)]
    conn.close()
    return statistics.median(s[0] for s in samples), statistics.median(s[1] for s in samples)


def throughput(host: str, port: int, path: str, token: str, seconds: float = 3.0) -> float:
    done = [0] * 8
    stop = time.monotonic() + seconds

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port)
        while time.monotonic() < stop:
            one(conn, host, path, token)
            done[index] += 1
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(done) / seconds


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    with fake_provider(KEY) as provider:
        base = provider.base_url
        home = Path(tempfile.mkdtemp(prefix="tgd-bench-", dir="/tmp"))
        settings = {"provider": {"baseUrl": base}, "logging": {"requestTrace": True}}
        config = {"api": {"base_url": base}, "relay": {"enabled": True, "listen": "127.0.0.1:0"}}
        daemon = start_daemon(home, settings, config, env={"TAOTOKEN_API_KEY": KEY})
        try:
            with daemon.client() as client:
                answer = client.relay_token()
            relay_host, token = answer["listen"], answer["token"]
            relay_port = int(relay_host.rsplit(":", 1)[1])
            direct_host = f"127.0.0.1:{provider.port}"
            rows = {}
            for name, host, port, path in (
                ("direct", direct_host, provider.port, "/api/v1/chat/completions"),
                ("relay", relay_host, relay_port, "/v1/chat/completions"),
            ):
                provider.default = Reply()
                p50, _ = latency(host, port, path, token, n)
                provider.default = Reply(events=openai_stream("m", words=3))
                _, ttfb = latency(host, port, path, token, n // 3)
                provider.default = Reply()
                rows[name] = (p50, ttfb, throughput(host, port, path, token))
            for name, (p50, ttfb, rps) in rows.items():
                print(
                    f"{name:7} p50 {p50 * 1e3:7.3f} ms  stream TTFB {ttfb * 1e3:7.3f} ms  "
                    f"8 clients {rps:7.0f} req/s"
                )
            d, r = rows["direct"], rows["relay"]
            print(f"added: p50 {(r[0] - d[0]) * 1e3:.3f} ms, TTFB {(r[1] - d[1]) * 1e3:.3f} ms")
        finally:
            daemon.stop()


if __name__ == "__main__":
    main()
