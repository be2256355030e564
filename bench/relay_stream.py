"""One big SSE stream through the relay: its rate and what the daemon's memory did.

    python -m bench.relay_stream [--mib 1024] [--piece-kib 64]      (from the repository's root)

A raw asyncio provider on 127.0.0.1 sends `--mib` MiB of `data:` events in chunks of
`--piece-kib` KiB as fast as the relay takes them; a client reads the stream off the relay's
TCP listener. Printed: MiB/s, the daemon's RSS before and at its end and its peak (VmHWM),
and the daemon's CPU seconds over the stream. Run it on two trees (PYTHONPATH) for an A/B:
what the key's scrub (taogpud/relay/scrub.py) costs a stream is the difference.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import threading
import time
from pathlib import Path

from taogpud.testing import running

KEY = "sk-bench-" + "0" * 24


async def _serve(writer: asyncio.StreamWriter, total: int, piece: int) -> None:
    text = b'{"choices":[{"index":0,"delta":{"content":"a token or two "}}]} ' * (piece // 64 + 1)
    event = b"data: " + text[: piece - 8] + b"\n\n"  # JSON-like text, as a provider's
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for _ in range(total // piece):
        writer.write(b"%x\r\n%s\r\n" % (len(event), event))
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


def provider(total: int, piece: int, ready: threading.Event, port: list[int]) -> None:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        while (await reader.readline()) not in (b"\r\n", b""):
            pass  # the request head; the relay sends no body for GET
        await _serve(writer, total, piece)
        writer.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        port.append(server.sockets[0].getsockname()[1])
        ready.set()
        await server.serve_forever()

    asyncio.run(main())


def proc_status(pid: int) -> dict[str, int]:
    fields = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, value = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            fields[name] = int(value.split()[0]) // 1024  # MiB
    return fields


def cpu_s(pid: int) -> float:
    parts = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / 100  # utime + stime, clock ticks of 10 ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--piece-kib", type=int, default=64)
    args = parser.parse_args()
    total, piece = args.mib << 20, args.piece_kib << 10
    ready, port = threading.Event(), []
    threading.Thread(target=provider, args=(total, piece, ready, port), daemon=True).start()
    ready.wait()
    base = f"http://127.0.0.1:{port[0]}/api"
    settings = {"provider": {"baseUrl": base}}
    config = {"api": {"base_url": base}, "relay": {"enabled": True, "listen": "127.0.0.1:0"}}
    with running(settings, config, {"TAOTOKEN_API_KEY": KEY}, prefix="tgd-bench-") as daemon:
        with daemon.client() as client:
            answer = client.relay_token()
        host, _, relay_port = answer["listen"].rpartition(":")
        pid = daemon.proc.pid
        before, cpu_before = proc_status(pid), cpu_s(pid)
        conn = http.client.HTTPConnection(host, int(relay_port))
        headers = {"Host": answer["listen"], "Authorization": f"Bearer {answer['token']}"}
        started = time.perf_counter()
        conn.request("GET", "/v1/stream", headers=headers)
        response = conn.getresponse()
        got = 0
        while chunk := response.read1(1 << 20):
            got += len(chunk)
        took = time.perf_counter() - started
        after, cpu_after = proc_status(pid), cpu_s(pid)
    print(
        f"{got / (1 << 20):.0f} MiB in {took:.2f} s: {got / (1 << 20) / took:.0f} MiB/s; "
        f"daemon CPU {cpu_after - cpu_before:.2f} s; RSS {before['VmRSS']} -> "
        f"{after['VmRSS']} MiB, peak {after['VmHWM']} MiB (before: {before['VmHWM']})"
    )


if __name__ == "__main__":
    main()
