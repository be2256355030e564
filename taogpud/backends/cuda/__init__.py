"""The CUDA backend: the worker's device code, its kernels, samples, startup probe and evidence."""
