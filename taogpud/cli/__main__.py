"""python -m taogpud.cli → taogpuctl.

The package's own `main`, so there is one copy of taogpud.cli and one Globals class: the
command modules (cli/guide.py, …) import taogpud.cli.
"""

from taogpud.cli import main

main()
