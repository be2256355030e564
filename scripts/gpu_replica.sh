#!/usr/bin/env bash
# CI's "GPU-host replica" tier (`make gpu-replica`): the GPU host as far as it is known,
# here. Python 3.12 with only packaging/gpu-host/packages.txt installed (GPU-only libraries
# aside), the wheels `make gpu-wheels` carries installed the way docs/gpu-check.md installs
# them on the host (`--no-index --no-deps --target`, that folder first on PYTHONPATH), then:
#   1. every taogpud module imports, at a version pyproject.toml accepts;
#   2. scripts/gpu_check.py imports the daemon and exits 0 saying there is no GPU;
#   3. `pytest -m gpu --collect-only` over the check's test files;
#   4. the CPU tests in those files.
# Any ImportError, or a version the code cannot use, fails it. Needs the network once (PyPI,
# for the host list and the wheels); pip's cache makes later runs quick.
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
WORK=${REPLICA_DIR:-/tmp/taogpud-gpu-replica}
HOST_LIST=packaging/gpu-host/packages.txt
started=$(date +%s)
step() { echo "gpu-replica: [$(($(date +%s) - started)) s] $*"; }

# Python 3.12, as on the host: PYTHON312, else python3.12 where it runs, else pyenv's.
find_python312() {
    local candidate
    for candidate in "${PYTHON312:-}" python3.12 "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12; do
        [ -n "$candidate" ] || continue
        if "$candidate" -c 'import sys, venv; assert sys.version_info[:2] == (3, 12)' 2>/dev/null; then
            command -v "$candidate" || echo "$candidate"
            return 0
        fi
    done
    return 1
}
if ! PY312=$(find_python312); then
    echo "gpu-replica: no Python 3.12 here (tried \$PYTHON312, python3.12, pyenv's versions/3.12*);" >&2
    echo "gpu-replica: install one (pyenv install 3.12, or a python3.12 package) or set PYTHON312" >&2
    exit 1
fi
step "Python $("$PY312" -c 'import platform; print(platform.python_version())') at $PY312"

# The host's packages, exactly the list's versions, nothing resolved beyond it.
VENV=$WORK/venv
STAMP=$VENV/.host-list.sha256
want=$(sha256sum "$HOST_LIST" | cut -d' ' -f1)
if [ ! -f "$STAMP" ] || [ "$(cat "$STAMP")" != "$want" ]; then
    rm -rf "$VENV"
    "$PY312" -m venv "$VENV"
    grep -v -e '^#' -e '^python==' -e '# gpu-only' "$HOST_LIST" | sed 's/ *#.*//' | grep . >"$WORK/host-requirements.txt"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps \
        -r "$WORK/host-requirements.txt"
    echo "$want" >"$STAMP"
fi
step "host packages: $(wc -l <"$WORK/host-requirements.txt") from $HOST_LIST"

# The carried wheels, derived from this checkout's closure (the CI venv where there is one).
DERIVE=python3
[ -x .venv/bin/python ] && DERIVE=.venv/bin/python
# (pip's warnings about this machine's extra index folders are dropped)
"$DERIVE" scripts/gpu_wheels.py --dest "$WORK/whl" 2> >(grep -v "is ignored: it is neither" >&2) | tail -1
SITE=$WORK/site
rm -rf "$SITE"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-index --no-deps \
    --no-compile --no-cache-dir --upgrade --target "$SITE" "$WORK"/whl/*.whl
export PYTHONPATH=$SITE
PY=$VENV/bin/python
step "carried wheels installed into $SITE (PYTHONPATH)"

# 1. every module, and the version each of taogpud's requirements resolves to here
"$PY" - <<'EOF'
import importlib, importlib.metadata as metadata, pkgutil, sys, tomllib
from packaging.requirements import Requirement
import taogpud

OPTIONAL = {"ray", "pyopencl", "mako"}  # extras the GPU host does not have (ray, opencl)
OPTIONAL |= {"schemathesis", "hypothesis"}  # the dev extra: taogpud.testing.fuzzing alone
bad, skipped, count = [], [], 0
for module in pkgutil.walk_packages(taogpud.__path__, "taogpud."):
    if module.name.endswith("__main__"):
        continue  # it runs the daemon
    try:
        importlib.import_module(module.name)
        count += 1
    except ImportError as exc:
        (skipped if (exc.name or "").split(".")[0] in OPTIONAL else bad).append(f"{module.name}: {exc!r}")
for text in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]:
    requirement = Requirement(text)
    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        bad.append(f"{requirement.name}: not installed"); continue
    if not requirement.specifier.contains(version, prereleases=True):
        bad.append(f"{requirement.name} {version} is not {requirement.specifier}")
print(f"gpu-replica: {count} taogpud modules import; optional, not on the host: {len(skipped)}")
for line in skipped:
    print(f"  skipped {line}")
for line in bad:
    print(f"  FAILED {line}", file=sys.stderr)
sys.exit(1 if bad else 0)
EOF
step "imports ok"

# 2. the check itself: it must import the daemon first and say there is no GPU
out=$("$PY" -m scripts.gpu_check 2>&1) || { echo "$out"; echo "gpu-replica: gpu_check.py failed" >&2; exit 1; }
echo "$out" | sed 's/^/  /'
grep -q "no GPU" <<<"$out" || { echo "gpu-replica: gpu_check.py did not say 'no GPU'" >&2; exit 1; }
step "gpu_check.py exited 0 with no GPU"

# 3. and 4. the check's test files: the gpu tests collect, the CPU tests pass; with the
# PYTHONPATH the check gives its pytest (the checkout first, then the carried wheels)
mapfile -t FILES < <("$PY" -m scripts.gpu_check --test-files)
export PYTHONPATH=$REPO:$SITE
"$PY" -m pytest -q -p no:cacheprovider -m gpu --collect-only "${FILES[@]}" | tail -1
step "pytest -m gpu --collect-only ok"
"$PY" -m pytest -q -p no:cacheprovider -n 2 "${FILES[@]}" | tail -3
step "done: the GPU-host replica passes"
