"""Arrays in a client's own memory: the memfd a local client hands the daemon over the `.shm`
socket, its protocol, the daemon's server, the client's side, and how a worker maps and pins
it (docs/shared-memory.md)."""
