#!/bin/sh
# The wheels the GPU check needs on the GPU host (Python 3.12, CuPy for CUDA 13 and NVML
# preinstalled, no network), downloaded here into .whl/ (git-ignored), 3.12 manylinux builds.
# Only what that host lacks: numpy, httpx, typer, rich, prometheus-client, pytest and
# nvidia-ml-py are there already. Versions: the ones this venv was tested with.
#
# Then, on the GPU host (the device tool's `run`, with carry [".whl"]):
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#       --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit; \
#   PYTHONUNBUFFERED=1 python3 scripts/gpu_check.py
set -eu
cd "$(dirname "$0")/.."
DEST=.whl
PYTHON=${PYTHON:-python3}
rm -rf "$DEST"
mkdir -p "$DEST"
"$PYTHON" -m pip download --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
    --platform manylinux1_x86_64 --platform any -d "$DEST" \
    pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
    typing-extensions==4.16.0 pydantic-settings==2.16.3 python-dotenv==1.2.4 \
    structlog==26.1.0 orjson==3.13.0 watchfiles==1.3.0 fastapi==0.165.0 starlette==1.10.0 \
    annotated-doc==0.0.7 uvicorn==0.54.0 httptools==0.9.0
du -sh "$DEST"
ls "$DEST"
