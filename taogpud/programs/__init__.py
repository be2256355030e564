"""A user's own program as a job: its lease's processes, the NVML proof of what it did with its
GPUs, and a detached program's log (docs/programs.md)."""
