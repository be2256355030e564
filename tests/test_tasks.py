"""The task registry, the built-in tasks and the backends, in-process on real NumPy."""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from structlog.testing import capture_logs

from taogpud import tasks
from taogpud.backends import Backend, WorkerSpec, create_backend
from taogpud.backends.cpu import CpuBackend, blas_thread_env
from taogpud.backends.cuda.backend import _device_problem, probe_cuda
from taogpud.errors import BackendUnavailable, InvalidParams, UnknownTask
from taogpud.tasks import JobCancelled, TaskContext, TaskOutput
from taogpud.tasks.warmup import backend_for, warm
from taogpud.testing import RunningDaemon

REPO_ROOT = Path(__file__).resolve().parents[1]
SIZED_TASKS = ("vector_add", "saxpy", "reduce_sum", "fft", "sort")


def cpu_spec(**changes: Any) -> WorkerSpec:
    fields: dict[str, Any] = {
        "backend": "cpu",
        "index": 0,
        "stream_count": 2,
        "thread_num": 1,
        "memory_fraction": 0.5,
        "pool_size_mb": 0,
        "auto_grow": True,
        "cuda_arch": "auto",
        "enable_profiling": False,
    }
    return WorkerSpec(**{**fields, **changes})


@pytest.fixture(scope="module")
def cpu() -> Backend:
    backend = backend_for(cpu_spec())
    warm(backend)
    return backend


def run_task(
    backend: Backend,
    name: str,
    params: Mapping[str, Any] | None = None,
    inputs: Mapping[str, Any] | None = None,
    cancelled: threading.Event | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """Run a task the way a worker does: validate, move inputs in, run, move outputs out."""
    task = tasks.get(name)
    model = tasks.validate_params(task, dict(params or {}))
    with backend.slot(0):
        ctx = TaskContext(
            xp=backend.xp,
            backend=backend.name,
            device=f"{backend.name}:0",
            inputs={key: backend.to_device(value) for key, value in (inputs or {}).items()},
            cancelled=cancelled or threading.Event(),
        )
        output = task.body(ctx, model)
        backend.synchronize()
        arrays = {key: backend.to_host(value) for key, value in output.arrays.items()}
    json.dumps(output.summary, allow_nan=False)  # the summary must travel as JSON
    return output.summary, arrays


def draws(seed: int, count: int, shape: Any, dtype: Any = np.float32) -> list[Any]:
    """What the tasks generate: `count` arrays from default_rng(seed), in order."""
    rng = np.random.default_rng(seed)
    return [rng.random(shape, dtype=dtype) for _ in range(count)]


# ---------------------------------------------------------------------------- built-ins


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_vector_add_matches_numpy(cpu: Backend, dtype: Any) -> None:
    """vector_add returns a + b from the seeded arrays, and their float64 checksum."""
    summary, arrays = run_task(
        cpu, "vector_add", {"size": 1000, "seed": 7, "dtype": np.dtype(dtype).name}
    )
    a, b = draws(7, 2, 1000, dtype)
    np.testing.assert_array_equal(arrays["c"], a + b)
    assert summary["size"] == 1000
    assert summary["dtype"] == np.dtype(dtype).name
    assert summary["checksum"] == pytest.approx(float((a + b).sum(dtype=np.float64)))


def test_saxpy_matches_numpy(cpu: Backend) -> None:
    """saxpy returns alpha * x + y in float32 and echoes alpha."""
    summary, arrays = run_task(cpu, "saxpy", {"size": 500, "seed": 3, "alpha": 3.5})
    x, y = draws(3, 2, 500)
    np.testing.assert_allclose(arrays["out"], np.float32(3.5) * x + y, rtol=1e-6)
    assert arrays["out"].dtype == np.float32
    assert summary["alpha"] == 3.5
    assert summary["checksum"] == pytest.approx(float((3.5 * x + y).sum()), rel=1e-5)


def test_matmul_matches_numpy(cpu: Backend) -> None:
    """matmul returns a @ b for n × n matrices, with m, k, n and the checksum."""
    summary, arrays = run_task(cpu, "matmul", {"n": 33, "seed": 5, "dtype": "float64"})
    a, b = draws(5, 2, (33, 33), np.float64)
    np.testing.assert_allclose(arrays["c"], a @ b, rtol=1e-12)
    assert (summary["m"], summary["k"], summary["n"]) == (33, 33, 33)
    assert summary["checksum"] == pytest.approx(float((a @ b).sum()))


def test_reduce_sum_matches_numpy(cpu: Backend) -> None:
    """reduce_sum reports the sum of the seeded array in its own dtype."""
    summary, arrays = run_task(cpu, "reduce_sum", {"size": 10_000, "seed": 11})
    (x,) = draws(11, 1, 10_000)
    assert summary["sum"] == pytest.approx(float(x.sum()), rel=1e-6)
    assert summary["dtype"] == "float32"
    assert arrays == {}


def test_fft_of_a_known_signal_matches_numpy_fft(cpu: Backend) -> None:
    """fft of a cosine at bin 3 equals numpy.fft.fft: peaks of N/2 at bins 3 and N-3."""
    n = 64
    signal = np.cos(2 * np.pi * 3 * np.arange(n) / n)
    summary, arrays = run_task(cpu, "fft", {"dtype": "float64"}, inputs={"x": signal})
    np.testing.assert_allclose(arrays["spectrum"], np.fft.fft(signal), atol=1e-9)
    assert abs(arrays["spectrum"][3]) == pytest.approx(n / 2)
    assert abs(arrays["spectrum"][n - 3]) == pytest.approx(n / 2)
    assert summary["dtype"] == "complex128"
    assert summary["parseval_ok"] is True
    assert summary["energy"] == pytest.approx(n / 2)


def test_fft_of_generated_float32_data_is_complex64(cpu: Backend) -> None:
    """fft on generated float32 data gives a complex64 spectrum equal to numpy's."""
    summary, arrays = run_task(cpu, "fft", {"size": 4096, "seed": 2})
    (x,) = draws(2, 1, 4096)
    assert arrays["spectrum"].dtype == np.complex64
    np.testing.assert_allclose(arrays["spectrum"], np.fft.fft(x), rtol=1e-4, atol=1e-3)
    assert summary["parseval_ok"] is True


def test_sort_verifies_order_and_reports_min_max(cpu: Backend) -> None:
    """sort returns numpy.sort of the seeded data, verified sorted, with its min and max."""
    summary, arrays = run_task(cpu, "sort", {"size": 5000, "seed": 9})
    (x,) = draws(9, 1, 5000)
    np.testing.assert_array_equal(arrays["sorted"], np.sort(x))
    assert summary["is_sorted"] is True
    assert summary["min"] == float(x.min())
    assert summary["max"] == float(x.max())
    assert summary["nan_count"] == 0


def test_sort_counts_nans_and_still_verifies_the_numbers(cpu: Backend) -> None:
    """NaNs sort last and are counted; the numbers before them are still verified sorted."""
    values = np.array([3.0, np.nan, 1.0, 2.0])
    summary, _ = run_task(cpu, "sort", {"dtype": "float64"}, inputs={"x": values})
    assert summary["is_sorted"] is True
    assert (summary["min"], summary["max"], summary["nan_count"]) == (1.0, 3.0, 1)


def test_probe_reports_where_it_ran(cpu: Backend) -> None:
    """probe names the cpu backend, this process, numpy arrays, and a correct check."""
    summary, _ = run_task(cpu, "probe")
    assert summary["backend"] == "cpu"
    assert summary["device"] == "cpu:0"
    assert summary["pid"] == os.getpid()
    assert summary["array_module"] == "numpy"
    assert summary["check"]["ok"] is True
    assert summary["check"]["got"] == summary["check"]["expected"]


def test_noop_returns_an_empty_summary(cpu: Backend) -> None:
    """noop does nothing and says nothing."""
    assert run_task(cpu, "noop") == ({}, {})


def test_sleep_of_zero_ms_returns_at_once(cpu: Backend) -> None:
    """sleep with ms=0 returns its summary without waiting."""
    assert run_task(cpu, "sleep", {"ms": 0})[0] == {"slept_ms": 0}


def test_sleep_stops_when_cancelled(cpu: Backend) -> None:
    """A one-minute sleep raises JobCancelled once its event is set."""
    cancelled = threading.Event()
    outcome: list[BaseException] = []

    def sleep_a_minute() -> None:
        try:
            run_task(cpu, "sleep", {"ms": 60_000}, cancelled=cancelled)
        except JobCancelled as exc:
            outcome.append(exc)

    sleeper = threading.Thread(target=sleep_a_minute)
    sleeper.start()
    sleeper.join(timeout=0.05)
    assert sleeper.is_alive()  # it is waiting, not finished
    cancelled.set()
    sleeper.join(timeout=5)
    assert not sleeper.is_alive()
    assert len(outcome) == 1


def test_bodies_stop_between_steps_when_cancelled(cpu: Backend) -> None:
    """A job cancelled before it runs raises JobCancelled instead of finishing."""
    cancelled = threading.Event()
    cancelled.set()
    with pytest.raises(JobCancelled):
        run_task(cpu, "vector_add", {"size": 10}, cancelled=cancelled)


# ---------------------------------------------------------------------------- inputs


def test_inputs_replace_generated_arrays_and_size_follows_them(cpu: Backend) -> None:
    """vector_add with inputs a and b adds them; size is theirs, not the params'."""
    a = np.arange(5, dtype=np.float32)
    b = np.full(5, 10, dtype=np.float32)
    summary, arrays = run_task(cpu, "vector_add", {"size": 1000}, inputs={"a": a, "b": b})
    np.testing.assert_array_equal(arrays["c"], a + b)
    assert summary["size"] == 5
    assert summary["checksum"] == float((a + b).sum())


def test_one_input_given_generates_the_other_at_its_size(cpu: Backend) -> None:
    """vector_add with only a given generates b at a's size from the seed."""
    a = np.ones(7, dtype=np.float32)
    _, arrays = run_task(cpu, "vector_add", {"seed": 4}, inputs={"a": a})
    assert arrays["c"].shape == (7,)
    (first_draw,) = draws(4, 1, 7)
    np.testing.assert_array_equal(arrays["c"], a + first_draw)


def test_inputs_are_converted_to_the_params_dtype(cpu: Backend) -> None:
    """Integer inputs are computed in the requested dtype."""
    summary, arrays = run_task(
        cpu,
        "saxpy",
        {"dtype": "float64", "alpha": 1.0},
        inputs={"x": np.arange(3), "y": np.ones(3)},
    )
    assert arrays["out"].dtype == np.float64
    assert summary["checksum"] == 6.0


def test_inputs_of_different_shapes_are_rejected(cpu: Backend) -> None:
    """vector_add refuses a and b of different shapes, naming both shapes."""
    with pytest.raises(InvalidParams, match=r"\(3,\).*\(4,\)"):
        run_task(cpu, "vector_add", inputs={"a": np.ones(3), "b": np.ones(4)})


def test_complex_inputs_are_rejected(cpu: Backend) -> None:
    """A complex input is refused with its name and dtype, not silently truncated."""
    with pytest.raises(InvalidParams, match=r"'x' has dtype complex128"):
        run_task(cpu, "sort", inputs={"x": np.ones(3, dtype=np.complex128)})


@pytest.mark.parametrize("empty", [np.float64(1.0), np.ones(0)], ids=["scalar", "no-elements"])
def test_inputs_without_elements_are_rejected(cpu: Backend, empty: Any) -> None:
    """A 0-d or empty input is refused with its name and shape."""
    with pytest.raises(InvalidParams, match="'x' has shape"):
        run_task(cpu, "fft", inputs={"x": np.asarray(empty)})


def test_matmul_takes_rectangular_inputs(cpu: Backend) -> None:
    """matmul of a 3×4 and a 4×2 input gives a 3×2 product and says m, k, n."""
    a = np.arange(12, dtype=np.float64).reshape(3, 4)
    b = np.arange(8, dtype=np.float64).reshape(4, 2)
    summary, arrays = run_task(cpu, "matmul", {"dtype": "float64"}, inputs={"a": a, "b": b})
    np.testing.assert_array_equal(arrays["c"], a @ b)
    assert (summary["m"], summary["k"], summary["n"]) == (3, 4, 2)


def test_matmul_rejects_mismatched_inputs(cpu: Backend) -> None:
    """matmul names both shapes when a's columns differ from b's rows."""
    with pytest.raises(InvalidParams, match=r"\(3, 4\).*\(3, 2\)"):
        run_task(cpu, "matmul", inputs={"a": np.ones((3, 4)), "b": np.ones((3, 2))})


def test_unknown_input_names_are_rejected() -> None:
    """check_input_names refuses an input the task does not take, listing the ones it does."""
    with pytest.raises(InvalidParams) as caught:
        tasks.check_input_names(tasks.get("vector_add"), ["a", "z"])
    assert "'z'" in caught.value.message
    assert "a, b" in caught.value.hint
    tasks.check_input_names(tasks.get("vector_add"), ["b"])


# ---------------------------------------------------------------------------- params


def invalid(task: str, params: Any) -> InvalidParams:
    with pytest.raises(InvalidParams) as caught:
        tasks.validate_params(tasks.get(task), params)
    return caught.value


def test_wrong_type_names_the_field_and_the_value() -> None:
    """size='big' is refused naming size, the value given and what an integer needs."""
    error = invalid("vector_add", {"size": "big"})
    assert "size:" in error.message
    assert "'big'" in error.message
    assert "valid integer" in error.message


def test_unknown_field_suggests_the_close_one() -> None:
    """An unknown field 'sise' is refused with a did-you-mean for size."""
    error = invalid("vector_add", {"sise": 10})
    assert "sise: unknown parameter" in error.message
    assert "did you mean 'size'" in error.message


def test_negative_size_says_what_is_allowed() -> None:
    """size=-5 is refused naming the bound, and the hint lists every field and its range."""
    error = invalid("vector_add", {"size": -5})
    assert "size: Input should be greater than or equal to 1 (given -5)" in error.message
    assert "size: integer 1..2**48" in error.hint
    assert "dtype: float32 | float64 (default float32)" in error.hint
    assert error.code == "invalid_params"


def test_every_bad_field_is_reported_at_once() -> None:
    """Several bad fields give one error that names each of them."""
    error = invalid("saxpy", {"dtype": "int8", "alpha": "inf", "seed": True})
    for field in ("dtype:", "alpha:", "seed:"):
        assert field in error.message


def test_params_that_are_not_an_object_are_refused() -> None:
    """A list instead of an object is refused, not crashed on."""
    assert "params:" in invalid("noop", [1, 2]).message


def test_huge_sizes_pass_validation_for_admission_to_judge() -> None:
    """size=10**13 is a valid request; admission, not the model, refuses it."""
    params = tasks.validate_params(tasks.get("vector_add"), {"size": 10**13})
    assert params.model_dump()["size"] == 10**13


def test_sleep_ms_is_bounded_to_a_day() -> None:
    """sleep refuses more than 86_400_000 ms."""
    assert "ms:" in invalid("sleep", {"ms": 86_400_001}).message


# ---------------------------------------------------------------------------- registry


def test_unknown_task_suggests_the_close_name() -> None:
    """get('vectr_add') raises UnknownTask suggesting vector_add."""
    with pytest.raises(UnknownTask, match="did you mean 'vector_add'"):
        tasks.get("vectr_add")


def test_unknown_task_without_close_names_lists_the_known_ones() -> None:
    """A name like no other gets the list of known tasks in the hint."""
    with pytest.raises(UnknownTask) as caught:
        tasks.get("zzzzzz")
    assert "did you mean" not in caught.value.message
    assert "vector_add" in caught.value.hint


def test_catalog_lists_every_builtin_as_json() -> None:
    """Every built-in is registered and its catalog entry is JSON."""
    names = [task.name for task in tasks.all_tasks()]
    builtins = ["vector_add", "saxpy", "matmul", "reduce_sum", "fft", "sort", "probe"]
    assert names[:9] == [*builtins, "noop", "sleep"]
    json.dumps([task.catalog_entry() for task in tasks.all_tasks()])


def test_registry_import_keeps_numpy_and_cupy_out() -> None:
    """Importing the registry and the backends package, and listing tasks, loads no numpy."""
    code = (
        "import sys, taogpud.tasks as t, taogpud.backends; t.all_tasks(); t.get('fft');"
        "print(sorted(m for m in ('numpy', 'cupy') if m in sys.modules))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO_ROOT, check=True
    )
    assert result.stdout.strip() == "[]"


# ---------------------------------------------------------------------------- estimates


def estimate(task: str, **params: Any) -> int:
    found = tasks.get(task)
    return found.estimate_bytes(tasks.validate_params(found, params))


@pytest.mark.parametrize("name", SIZED_TASKS)
def test_estimates_grow_with_size(name: str) -> None:
    """A bigger size needs more device memory, and float64 more than float32."""
    assert estimate(name, size=1000) < estimate(name, size=2000)
    assert estimate(name, size=1000) < estimate(name, size=1000, dtype="float64")


@pytest.mark.parametrize("name", SIZED_TASKS)
def test_an_absurd_size_gives_an_absurd_estimate(name: str) -> None:
    """size=10**13 is estimated above 10**13 bytes, so admission can refuse it."""
    assert estimate(name, size=10**13) > 10**13


def test_matmul_estimate_grows_with_n() -> None:
    """matmul holds three n × n matrices."""
    assert estimate("matmul", n=100) == 3 * 100 * 100 * 4
    assert estimate("matmul", n=200) > estimate("matmul", n=100)


def test_tasks_without_arrays_need_almost_nothing() -> None:
    """noop and sleep need no device memory; probe needs a few KiB."""
    assert estimate("noop") == 0
    assert estimate("sleep", ms=5) == 0
    assert 0 < estimate("probe") < 2**20


# ---------------------------------------------------------------------------- plug-ins

PLUGIN_MODULE = """
from pydantic import BaseModel, ConfigDict
from taogpud.tasks.base import Task, TaskOutput


class Params(BaseModel):
    model_config = ConfigDict(extra="forbid")
    value: int = 1


def double(ctx, params):
    return TaskOutput(summary={"doubled": int(ctx.xp.asarray(params.value) * 2)})


TASKS = [Task("demo_double", "doubles value", Params, double, lambda params: 8)]
SHADOW = Task("vector_add", "tries to replace a built-in", Params, double, lambda params: 0)
NOT_A_TASK = 42


def make_tasks():
    return Task("demo_factory", "from a factory", Params, double, lambda params: 0)
"""


@pytest.fixture
def install_plugin(tmp_path: Path) -> Iterator[Callable[[dict[str, str]], list[str]]]:
    """Installs a throwaway distribution with the given entry points; returns the problems."""
    site = tmp_path / "site"
    dist_info = site / "taogpud_demo_plugin-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (site / "taogpud_demo_plugin.py").write_text(PLUGIN_MODULE)
    (site / "taogpud_broken_plugin.py").write_text("raise ImportError('needs libfoo')\n")
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: taogpud-demo-plugin\n")

    def install(entry_points: dict[str, str]) -> list[str]:
        lines = [f"{name} = {target}" for name, target in entry_points.items()]
        (dist_info / "entry_points.txt").write_text("[taogpud.tasks]\n" + "\n".join(lines))
        sys.path.insert(0, str(site))
        importlib.invalidate_caches()
        return tasks.reload_plugins()

    yield install
    sys.path.remove(str(site))
    for module in ("taogpud_demo_plugin", "taogpud_broken_plugin"):
        sys.modules.pop(module, None)
    importlib.invalidate_caches()
    tasks.reload_plugins()


def test_a_plugin_entry_point_adds_tasks(
    install_plugin: Callable[[dict[str, str]], list[str]], cpu: Backend
) -> None:
    """Tasks from a list and from a factory entry point register and run."""
    problems = install_plugin(
        {"demo": "taogpud_demo_plugin:TASKS", "factory": "taogpud_demo_plugin:make_tasks"}
    )
    assert problems == []
    assert run_task(cpu, "demo_double", {"value": 21})[0] == {"doubled": 42}
    assert tasks.get("demo_factory").description == "from a factory"
    assert [task.name for task in tasks.all_tasks()][-2:] == ["demo_double", "demo_factory"]


def test_broken_plugins_are_skipped_with_a_message(
    install_plugin: Callable[[dict[str, str]], list[str]],
) -> None:
    """A plug-in that fails to import, yields a non-task or shadows a built-in is skipped
    and logged; the good one beside it still loads."""
    with capture_logs() as logs:
        problems = install_plugin(
            {
                "broken": "taogpud_broken_plugin:TASKS",
                "wrong": "taogpud_demo_plugin:NOT_A_TASK",
                "shadow": "taogpud_demo_plugin:SHADOW",
                "demo": "taogpud_demo_plugin:TASKS",
            }
        )
    text = "\n".join(problems)
    assert "'broken' (taogpud_broken_plugin:TASKS) failed to load" in text
    assert "ImportError: needs libfoo" in text
    assert "'wrong'" in text and "got int" in text
    assert "'vector_add': that name is already taken" in text
    assert [entry["event"] for entry in logs] == ["task_plugin_skipped"] * 3
    assert tasks.get("vector_add").description.startswith("c = a + b")
    assert tasks.get("demo_double").name == "demo_double"
    assert tasks.plugin_problems() == problems


# ---------------------------------------------------------------------------- backends


def test_cpu_backend_reports_its_device() -> None:
    """A warm cpu backend names the cpu, the host memory, its cap and the warm-up time."""
    info = warm(backend_for(cpu_spec(index=1, memory_fraction=0.25)))
    assert (info.backend, info.device, info.index) == ("cpu", "cpu:1", 1)
    assert info.name
    assert info.memory_total_bytes > 0
    assert info.memory_cap_bytes == int(info.memory_total_bytes * 0.25)
    assert info.warmup_ms > 0
    assert info.extra == {}


def test_cpu_fallback_carries_its_reason() -> None:
    """A cpu worker standing in for cuda reports why, and probe repeats it."""
    backend = CpuBackend(cpu_spec(fallback_reason="No NVIDIA driver is loaded."))
    info = backend.warm()
    assert info.as_dict()["fallback_reason"] == "No NVIDIA driver is loaded."
    ctx = TaskContext(backend.xp, "cpu", "cpu:0", {}, threading.Event(), info.as_dict())
    output = tasks.get("probe").body(ctx, tasks.validate_params(tasks.get("probe"), {}))
    assert isinstance(output, TaskOutput)
    assert output.summary["fallback_reason"] == "No NVIDIA driver is loaded."


def test_blas_thread_env_caps_every_runtime() -> None:
    """blas_thread_env sets OMP, OpenBLAS and MKL to thread_num, and refuses 0."""
    env = blas_thread_env(3)
    for key in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        assert env[key] == "3"
    with pytest.raises(ValueError, match="at least 1"):
        blas_thread_env(0)


def test_cpu_backend_treats_allocation_failure_as_out_of_memory(cpu: Backend) -> None:
    """numpy's 'Unable to allocate' error is out-of-memory; other errors are not."""
    with pytest.raises(MemoryError) as caught:
        np.empty(2**60, dtype=np.uint8)
    assert cpu.is_out_of_memory(caught.value)
    assert not cpu.is_out_of_memory(ValueError("no"))


def test_an_unknown_backend_is_refused() -> None:
    """create_backend names the backends that exist."""
    with pytest.raises(BackendUnavailable, match="cpu, cuda, opencl"):
        create_backend(cpu_spec(backend="rocm"))


def test_probe_cuda_explains_a_host_without_a_gpu() -> None:
    """Without a working GPU, probe_cuda answers one sentence; with CuPy, about the driver."""
    problem = probe_cuda([0])
    if problem is None:
        pytest.skip("this host has a working GPU")
    assert problem.strip().endswith(".")
    if importlib.util.find_spec("cupy") is not None:
        assert "driver" in problem.lower()
    else:
        assert "pip install 'taogpud[cuda12]'" in problem


def test_probe_cuda_without_cupy_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    """With CuPy not importable, probe_cuda names the pip extras to install."""
    monkeypatch.setitem(sys.modules, "cupy", None)  # makes `import cupy` fail as if absent
    problem = probe_cuda([0])
    assert problem is not None
    assert problem.startswith("CuPy is not installed")
    assert "pip install 'taogpud[cuda12]'" in problem and "'taogpud[cuda13]'" in problem


def test_a_missing_device_index_names_how_many_exist() -> None:
    """Asking for GPU 3 on a two-GPU host says there are two, 0..1."""
    problem = _device_problem(2, [0, 3])
    assert problem is not None
    assert "device 3" in problem and "2 CUDA devices (0..1)" in problem
    assert _device_problem(2, [0, 1]) is None
    assert "no GPU" in (_device_problem(0, []) or "")


# ---------------------------------------------------------------------------- gpu


GPU_PROBLEM = probe_cuda([0])
needs_gpu = pytest.mark.skipif(
    GPU_PROBLEM is not None, reason=f"needs a GPU: {textwrap.shorten(str(GPU_PROBLEM), 120)}"
)


@pytest.fixture(scope="module")
def gpu() -> Backend:
    backend = backend_for(cpu_spec(backend="cuda", pool_size_mb=64))
    warm(backend)
    return backend


@pytest.mark.gpu
@needs_gpu
def test_probe_on_cuda_reports_the_gpu(gpu: Backend) -> None:
    """probe on cuda reports cupy arrays, the device's UUID, PCI bus id and capability."""
    summary, _ = run_task(gpu, "probe")
    assert summary["array_module"] == "cupy"
    assert summary["uuid"].startswith("GPU-")
    assert summary["pci_bus_id"]
    assert summary["compute_capability"]


def summed_magnitude(arrays: Mapping[str, Any]) -> float:
    """sum |element| over a task's outputs: the size of what its checksums add up."""
    return float(sum(np.abs(np.asarray(array)).sum() for array in arrays.values()))


def agrees_with(expected: float, scale: float) -> Any:
    """Two valid float64 results agree to 1e-9 of themselves, or of the magnitude that was
    summed: an fft's checksums are 0 plus rounding noise (±1e-12 here), which no relative
    tolerance of 0 accepts; rounding grows with what was summed, and so does this."""
    return pytest.approx(expected, rel=1e-9, abs=1e-9 * scale)


def test_the_checksum_tolerance_takes_rounding_noise_not_a_wrong_answer() -> None:
    """linspace's fft: checksums −9.1e-13 and 2.3e-13 (two valid FFTs) agree; 1e-3 off does not."""
    spectrum = np.fft.fft(np.linspace(0, 1, 4096))
    scale = summed_magnitude({"spectrum": spectrum})
    assert agrees_with(2.3e-13, scale) == -9.1e-13
    assert pytest.approx(2.3e-13, rel=1e-9) != -9.1e-13  # what the old tolerance said
    assert agrees_with(2.3e-13, scale) != 1e-3
    assert agrees_with(1.0, 1.0) != 1.0 + 1e-7  # a vector_add-sized checksum stays strict


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["vector_add", "saxpy", "reduce_sum", "fft", "sort"])
def test_builtins_on_cuda_match_numpy_for_the_same_inputs(gpu: Backend, name: str) -> None:
    """Given the same inputs, each elementwise built-in on cuda agrees with the cpu backend."""
    inputs = {key: np.linspace(0, 1, 4096) for key in tasks.get(name).inputs}
    on_gpu, gpu_arrays = run_task(gpu, name, {"dtype": "float64"}, inputs=inputs)
    on_cpu, cpu_arrays = run_task(create_backend(cpu_spec()), name, {"dtype": "float64"}, inputs)
    scale = summed_magnitude(cpu_arrays)
    for key, value in on_cpu.items():
        assert on_gpu[key] == (agrees_with(value, scale) if isinstance(value, float) else value)
    for key, value in cpu_arrays.items():
        np.testing.assert_allclose(gpu_arrays[key], value, rtol=1e-9, atol=1e-9)


SUMMARY_PLUGIN = """
import numpy as np
from pydantic import BaseModel
from taogpud.tasks.base import Task, TaskOutput


class Params(BaseModel):
    pass


def numpy_values(ctx, params):
    x = ctx.xp.arange(4, dtype=ctx.xp.float32)
    return TaskOutput(summary={"sum": x.sum(), "count": np.int64(4), "values": np.arange(3)})


def not_json(ctx, params):
    return TaskOutput(summary={"handle": object()})


TASKS = [
    Task("numpy_summary", "numpy values in its summary", Params, numpy_values, lambda p: 0),
    Task("opaque_summary", "an object in its summary", Params, not_json, lambda p: 0),
]
"""


def test_a_summary_of_numpy_values_arrives_plain_and_one_that_is_not_json_fails_only_its_job(
    daemon_factory: Callable[..., RunningDaemon], tmp_path: Path
) -> None:
    """A plug-in's summary goes through JSON in the worker: numpy scalars and arrays become
    numbers and lists; an object fails that job with bad_summary. Before, such a result
    reached the job store, whose every later commit then failed."""
    site = tmp_path / "site"
    dist_info = site / "taogpud_summary_plugin-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (site / "taogpud_summary_plugin.py").write_text(SUMMARY_PLUGIN)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: taogpud-summary-plugin\n")
    (dist_info / "entry_points.txt").write_text(
        "[taogpud.tasks]\nsummaries = taogpud_summary_plugin:TASKS\n"
    )
    path = os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")]))
    daemon = daemon_factory(env={"PYTHONPATH": path})
    with daemon.client() as client:
        plain = client.run("numpy_summary")
        opaque = client.run("opaque_summary")
        after = client.run("noop")
    assert plain["status"] == "succeeded", plain
    assert plain["result"] == {"sum": 6.0, "count": 4, "values": [0, 1, 2]}
    assert opaque["status"] == "failed"
    assert opaque["error"]["code"] == "bad_summary"
    assert "not JSON" in opaque["error"]["message"] and "float(x)" in opaque["error"]["hint"]
    assert after["status"] == "succeeded"
    assert daemon.stop() == 0
    restarted = daemon.restart()  # the store kept committing: all three are there
    with restarted.client() as client:
        stored = {job["id"]: job["status"] for job in client.list_jobs()}
    restarted.stop()
    assert stored == {plain["id"]: "succeeded", opaque["id"]: "failed", after["id"]: "succeeded"}
