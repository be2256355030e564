"""python -m taogpud.cli → taogpuctl.

The package's own `main` (the hot path, else the typer app), so there is one copy of each
command module and one Globals class (cli/context.py) whichever way taogpuctl is started.
"""

from taogpud.cli import main

main()
