"""The daemon: lifecycle (startup, main loop, shutdown), its state, reload, the shm server."""
