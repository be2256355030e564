"""Uploaded arrays as files: each a complete .npy image under /dev/shm, written by the API,
mapped by workers (docs/shared-memory.md calls this the upload path)."""
