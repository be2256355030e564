"""The OpenCL backend: the worker's device code, memory budget, probe and doctor report."""
