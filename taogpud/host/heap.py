"""Start-up's objects, frozen out of the cyclic garbage collector's scans (standard library).

A full collection walks every object the collector tracks. What a process makes at start
— the daemon's imports, its app and routes; a worker's numpy, backend and tasks — lives as
long as the process, so walking it again finds nothing: the daemon's is about 85,000
objects, and one walk took 57 ms on the 2-core test host. The daemon's loop stops for it,
so every job in flight waited, every few thousand jobs (docs/performance.md). Frozen
(`gc.freeze`, the permanent generation), those objects are never walked again; everything
made later is collected as before. Freezing does not keep them alive: what refcounting
frees is freed, and only a cycle among them would stay (start-up's own garbage is collected
first).
"""

from __future__ import annotations

import gc


def freeze_start_up() -> int:
    """Collect start-up's garbage, then freeze what is left; how many objects that was."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
