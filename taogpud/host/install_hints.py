"""How to add a missing optional part (CuPy, NVML, pyopencl, NVRTC), said for the way this
taogpud was installed: `pip install 'taogpud[...]'` for a pip install, but a packaged install
(the .deb or RPM, a venv under /opt/taogpud without pip) needs another build of the package,
or the CPU pair that every package ships.

packaging/build.py writes PACKAGE_MARKER into the venv's root; its one line names the extras
that build holds.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Literal

PACKAGE_MARKER = "taogpud-package"
CPU_PAIR = "/usr/share/doc/taogpud/examples/cpu"
Part = Literal["cuda", "nvml", "opencl", "nvrtc", "mcp"]

PIP_HINTS: dict[Part, str] = {
    "cuda": "pip install 'taogpud[cuda12]' (CUDA 12 driver) or 'taogpud[cuda13]' (CUDA 13 driver)",
    "nvml": "pip install 'taogpud[nvml]'",
    "opencl": "pip install 'taogpud[opencl]'",
    "nvrtc": "install the CUDA toolkit's NVRTC, e.g. pip install nvidia-cuda-nvrtc-cu12",
    "mcp": "pip install 'taogpud[mcp]' (the official MCP SDK)",
}
_OR_CPU = f"or run on the CPU: copy settings.json and config.toml from {CPU_PAIR}/ to /etc/taogpud/"
PACKAGED_HINTS: dict[Part, str] = {
    "cuda": "install the CUDA build of the package, the one for this driver (built with "
    f"`make deb EXTRAS=cuda12`, or EXTRAS=cuda13 for a CUDA 13 driver), {_OR_CPU}",
    "nvml": "install the CUDA build of the package (`make deb EXTRAS=cuda12` includes NVML)",
    "opencl": f"install a build of the package with OpenCL (`make deb EXTRAS=opencl`), {_OR_CPU}",
    "nvrtc": "install the CUDA toolkit's NVRTC (libnvrtc.so.12) from the NVIDIA repository "
    f"(cuda-nvrtc-12-x), {_OR_CPU}",
    "mcp": "the package ships without the MCP SDK: install taogpud with its mcp extra in a "
    "venv of your own (pip install '.[mcp]' in its source) and run that venv's taogpuctl mcp",
}


def packaged(prefix: str | Path | None = None) -> bool:
    """Whether this interpreter's environment is a package's venv (packaging/build.py)."""
    return (Path(sys.prefix if prefix is None else prefix) / PACKAGE_MARKER).is_file()


def install_hint(part: Part, prefix: str | Path | None = None) -> str:
    """The fix for a missing `part`, for this kind of install."""
    return (PACKAGED_HINTS if packaged(prefix) else PIP_HINTS)[part]
