"""taogpuctl's exit codes, as the table in taogpud.cli's docstring gives them (DESIGN §11)."""

EXIT_OK = 0
EXIT_FAILED = 1  # the job or check failed
EXIT_USAGE = 2  # usage or config error
EXIT_UNREACHABLE = 3  # the daemon cannot be reached
EXIT_NOT_IN_GROUP = 4  # the socket is its group's (taogpu), and this user is not in it
EXIT_STILL_RUNNING = 124  # a wait's --timeout passed before the job finished (as timeout(1))
EXIT_INTERRUPTED = 130  # Ctrl-C, as typer answers it
