#!/bin/sh
# The wheels the GPU host lacks (Python 3.12, CuPy for CUDA 13 and NVML preinstalled, no
# network), into .whl/ (git-ignored): taogpud's runtime closure minus
# packaging/gpu-host/packages.txt, derived by scripts/gpu_wheels.py. The old .whl/ stays
# until a new download has succeeded. PYTHON: the venv's where there is one, else python3.
#
# Then, on the GPU host (the device tool's `run`, with carry [".whl"]): docs/gpu-check.md.
set -eu
cd "$(dirname "$0")/.."
if [ -z "${PYTHON:-}" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi
exec "$PYTHON" scripts/gpu_wheels.py --dest .whl "$@"
