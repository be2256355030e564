"""The host and the software the numbers were measured with."""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from bench.pyspy_profile import py_spy

PACKAGES = (
    "taogpud", "numpy", "fastapi", "starlette", "uvicorn", "uvloop", "httptools", "pydantic",
    "structlog", "orjson", "dask", "distributed", "ray", "matplotlib",
)  # fmt: skip


def description() -> str:
    cpu = platform.machine()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory_gib = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / (1 << 30)
    return (
        f"{cpu}, {os.cpu_count()} CPUs, {memory_gib:.0f} GiB RAM, "
        f"{platform.system()} {platform.release()}, Python {platform.python_version()}"
    )


def load_average() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.2f} (1 min), {five:.2f} (5 min)"


def versions() -> str:
    found = []
    for package in PACKAGES:
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"{package} (not installed)")
    binary = py_spy()
    if binary is not None:
        done = subprocess.run(
            [str(binary), "--version"], check=False, capture_output=True, text=True
        )
        found.append(done.stdout.strip() or "py-spy")
    return ", ".join(found)


def now() -> str:
    return time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
