# One entry point for people and CI. `make test` is the README's test command.
VENV ?= .venv
PY := $(VENV)/bin/python
# hashed lock files, one per extra that ships (`make lock`)
LOCKS := packaging/locks
STAMP := $(VENV)/.installed

.PHONY: venv check i18n test test-quick test-gpu gpu-check gpu-wheels gpu-replica demo bench deb lock clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,cuda12,ray,opencl]'
	touch $(STAMP)

check: venv
	$(VENV)/bin/ruff check taogpud tests bench scripts packaging
	$(VENV)/bin/ruff format --check taogpud tests bench scripts packaging
	$(VENV)/bin/mypy
	$(PY) -m scripts.i18n --check

# The message catalogs (taogpud/i18n): extract the marked strings, merge them into each
# language's .po, compile the .mo the package ships. Translate in the .po, then run it again.
i18n: venv
	$(PY) -m scripts.i18n

test: check
	$(PY) -m pytest -q -n 2 --dist loadgroup --durations=10

# The loop to run on every change (CONTRIBUTING.md, under 90 s on an idle 2-core host): the
# pure and unit tests and the API checks on the in-process daemon. Nothing `slow`, no systemd,
# no GPU, no daemon process (`process`: tests/conftest.py marks a test whose fixtures start
# one). It always selects tests, so exit 5 (none selected) fails it.
QUICK := not slow and not systemd and not gpu and not process
test-quick: venv
	$(PY) -m pytest -q -n 2 --dist loadgroup -m "$(QUICK)" --durations=10

# On a host with an NVIDIA GPU: the GPU tier alone, with a report. Exit 5 (no test
# selected, i.e. no GPU here) is not a failure.
test-gpu: venv
	$(PY) -m pytest -q -m gpu --junitxml=gpu-report.xml || [ $$? -eq 5 ]

# On a GPU host: every GPU measurement and `pytest -m gpu`, as one report in
# bench/results/gpu-check.md (+ gpu-check-numbers.json). No venv there? make gpu-check PY=python3
gpu-check:
	PYTHONUNBUFFERED=1 $(PY) -m scripts.gpu_check

# The daemon's wheels for a GPU host without network (Python 3.12), into .whl/
# (docs/gpu-check.md): taogpud's closure minus packaging/gpu-host/packages.txt. No venv
# needed: without one, pip resolves the closure.
gpu-wheels:
	sh scripts/gpu_wheels.sh

# CI's "GPU-host replica" tier: Python 3.12 with only the GPU host's packages and the
# carried wheels, installed as on that host; the daemon imports, the check runs.
gpu-replica:
	bash scripts/gpu_replica.sh

# The demo's own venv, sized to the host: with an NVIDIA driver (its /proc entry or nvidia-smi)
# the cuda12 extra (CuPy with NVRTC, NVML); without one only what the CPU path runs on, no CuPy,
# Ray or pyopencl. Not the development venv: `make demo` is a first command, not a dev setup.
DEMO_VENV ?= .venv-demo
DEMO_EXTRAS ?= $(shell { [ -e /proc/driver/nvidia/version ] || command -v nvidia-smi; } >/dev/null 2>&1 && echo cuda12)
DEMO_STAMP := $(DEMO_VENV)/.installed-$(or $(DEMO_EXTRAS),cpu)

demo: $(DEMO_STAMP)
	$(DEMO_VENV)/bin/python scripts/demo.py

$(DEMO_STAMP): pyproject.toml $(LOCKS)/$(or $(DEMO_EXTRAS),cpu).txt
	rm -f $(DEMO_VENV)/.installed-*
	python3 -m venv $(DEMO_VENV)
	$(DEMO_VENV)/bin/python -m pip install -q --require-hashes --no-deps -r $(LOCKS)/$(or $(DEMO_EXTRAS),cpu).txt
	$(DEMO_VENV)/bin/python -m pip install -q --no-deps --no-build-isolation --no-index .
	touch $@

# Not part of the tests: installs dask, Ray and matplotlib to measure beside them.
bench: venv
	$(PY) -m pip install -q -e '.[bench]'
	$(PY) -m bench.run

# dist/taogpud_<version>_<arch>.deb: the units, sysusers/tmpfiles, /etc/taogpud and the app
# in a venv under /opt/taogpud. EXTRAS= for CPU only. The package's venv is filled from a
# build venv holding only what it ships (taogpud[EXTRAS]'s runtime closure, and `packaging`
# for build.py), installed from the lock file with --require-hashes: not the development venv,
# and never whatever the index serves today (a daemon that holds the API key).
EXTRAS ?= cuda12
DEB_VENV := build/deb-venv
deb:
	rm -rf $(DEB_VENV) && mkdir -p build
	/usr/bin/python3 -m venv $(DEB_VENV)
	$(DEB_VENV)/bin/pip install -q --require-hashes --no-deps -r $(LOCKS)/$(or $(EXTRAS),cpu).txt
	$(DEB_VENV)/bin/pip install -q --no-deps --no-build-isolation --no-index .
	$(DEB_VENV)/bin/python packaging/build.py deb --extras '$(EXTRAS)'

# packaging/locks/<extra>.txt: taogpud[extra]'s runtime closure (and the build backend), each
# version pinned with the hashes of its files, for every extra that ships: cpu (none) and
# cuda12. `make deb`, `make demo` and the README install from them with --require-hashes;
# tests/test_locks.py fails when pyproject.toml asks for what a lock lacks. `make lock` keeps
# the pins it can; `make lock UPGRADE=1` takes the newest. Needs uv (the dev extra) and PyPI.
LOCK_EXTRAS := cpu cuda12
lock:
	for extra in $(LOCK_EXTRAS); do \
	    $(PY) -m uv pip compile --quiet pyproject.toml $(LOCKS)/build.in \
	        $$( [ $$extra = cpu ] || echo --extra $$extra ) $(if $(UPGRADE),--upgrade) \
	        --generate-hashes --universal --python-version 3.11 \
	        --custom-compile-command "make lock" -o $(LOCKS)/$$extra.txt || exit 1; \
	done

clean:
	rm -rf $(VENV) $(DEMO_VENV) .mypy_cache .ruff_cache .pytest_cache
