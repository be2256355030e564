"""Worker processes: one spawned process per device, warm before the daemon is ready."""
