"""The OpenCL backend: the worker's device code, memory budget, probe and `devices` report."""
