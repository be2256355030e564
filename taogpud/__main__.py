"""python -m taogpud → the daemon, in the foreground."""

import sys

from taogpud.daemon.lifecycle import main

sys.exit(main())
