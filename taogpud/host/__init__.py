"""The host's system glue, standard library only: systemd (notify, credentials), paths, the Unix
socket and SO_PEERCRED, the frozen start-up heap, and how to install a missing part."""
