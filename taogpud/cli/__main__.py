"""python -m taogpud.cli → taogpuctl.

The package's own `main` (the hot path, else the typer app), so there is one copy of
taogpud.cli.app and one Globals class: the command modules (cli/guide.py, …) import it.
"""

from taogpud.cli import main

main()
