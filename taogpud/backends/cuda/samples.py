"""CUDA C kernels that ship with taogpud, for the `kernel` task's examples and the GPU check.

Each is compiled by NVRTC for the configured arch in CI (tests/test_cuda.py), without a GPU.
"""

from __future__ import annotations

# out[i] = a * x[i] + y[i]: the README's example and the GPU check's correctness run.
SAXPY = r"""
extern "C" __global__ void saxpy(const float* x, const float* y, float* out, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = a * x[i] + y[i];
}
"""

# Busy-waits `cycles` GPU clock ticks and writes when it began and ended (the GPU's global
# nanosecond timer): two jobs on two slots must overlap in time on the GPU itself.
SPIN = r"""
extern "C" __global__ void spin(long long cycles, long long* when) {
    long long began, ended;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(began));
    long long start = clock64();
    while (clock64() - start < cycles) { }
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ended));
    if (threadIdx.x == 0 && blockIdx.x == 0) { when[0] = began; when[1] = ended; }
}
"""

# Writes 4 TiB past its array, where nothing is mapped: cudaErrorIllegalAddress (700), a
# sticky error that leaves the worker's CUDA context unusable. The GPU check uses it to
# prove a respawn. (Through a pointer argument, so the compiler cannot drop the store.)
ILLEGAL_ADDRESS = r"""
extern "C" __global__ void illegal_address(float* base) {
    volatile float* far = base + (1LL << 40);
    *far = 1.0f;
}
"""

SAMPLES: dict[str, str] = {
    "saxpy": SAXPY,
    "spin": SPIN,
    "illegal_address": ILLEGAL_ADDRESS,
}
