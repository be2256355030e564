"""The one composition step: every service of the daemon built once, in the order they depend
on each other, and handed to what uses it.

    store → arrays → pool (not started) → scheduler → status → reloader → doors → state
          → relay (its tokens) → metrics registry → app → `.shm` server (not started)

Nothing here is a module global and nothing is fetched back later: the lifecycle
(daemon/lifecycle.py) starts what `compose` returns, serves it and stops it; the app gets
the state, the relay and the metrics registry passed in (api/app.py). This and the lifecycle
are the only modules above the API (tests/test_layers.py lists the names each may take).
"""

from __future__ import annotations

import os
import resource
from dataclasses import dataclass, field
from pathlib import Path

from fastapi import FastAPI

from taogpud import config
from taogpud.api.app import create_app
from taogpud.api.models import job_request_from
from taogpud.arrayfiles import images
from taogpud.arrayfiles.store import ArrayStore, array_budget_bytes, upload_quota_bytes
from taogpud.config.ray import serves_client_memory
from taogpud.daemon.metrics import DaemonCollector
from taogpud.daemon.reload import Reloader
from taogpud.daemon.state import DaemonState, DaemonStatus, Limits
from taogpud.doors import Doors
from taogpud.host import systemd
from taogpud.host.paths import default_socket, default_state_dir, kernel_cache_env
from taogpud.jobs.policy import Policy
from taogpud.jobs.scheduler import Scheduler
from taogpud.jobs.store import JobStore
from taogpud.memfd.server import ShmServer
from taogpud.observability.metrics import metrics_registry
from taogpud.pool.executor import create_pool
from taogpud.pool.plan import plan_workers
from taogpud.relay.forward import Relay
from taogpud.relay.metrics import RelayCollector
from taogpud.relay.tokens import FILE_NAME as RELAY_TOKENS_FILE
from taogpud.relay.tokens import TokenStore

STORE_NAME = "jobs.sqlite3"
OUTPUTS_DIR_NAME = "outputs"


@dataclass(frozen=True)
class Options:
    """What the daemon is started with; the entry point (lifecycle.main) parses argv into it.
    The paths are absolute: the reload watcher, doctor and `taogpuctl config` see the same
    files whatever directory they run from."""

    settings: Path | None = None  # settings.json (AI-tool side)
    config: Path | None = None  # config.toml (scheduler side)
    socket_path: Path = field(default_factory=default_socket)
    state_dir: Path = field(default_factory=default_state_dir)
    # False: a daemon inside another program (taogpud.testing's in-process harness). It
    # leaves what belongs to the whole process as it found it: signal handlers (only the
    # main thread may set them), the umask, os.environ, sockets systemd passed, the
    # garbage collector's frozen objects; and it lets go of its state directory's lock at
    # the end, as a process's exit would.
    owns_process: bool = True


@dataclass(frozen=True)
class Services:
    """What `compose` built: the lifecycle starts, serves and stops these."""

    state: DaemonState
    reloader: Reloader
    relay: Relay
    app: FastAPI
    shm: ShmServer | None  # None where client memory is not served (config.ray)


def compose(
    snapshot: config.ConfigSnapshot, options: Options, notifier: systemd.Notifier
) -> Services:
    """Build every service, none started: the workers are spawned by `Pool.start`, the
    listeners opened by the lifecycle."""
    state, reloader = _build_state(snapshot, options, notifier)
    relay = Relay(lambda: state.status.snapshot, TokenStore(options.state_dir / RELAY_TOKENS_FILE))
    registry = metrics_registry(DaemonCollector(state), RelayCollector(relay.use))
    app = create_app(state, relay, registry)
    return Services(state, reloader, relay, app, _shm_server(state))


def _build_state(
    snapshot: config.ConfigSnapshot, options: Options, notifier: systemd.Notifier
) -> tuple[DaemonState, Reloader]:
    """The store, the array store, the pool (not started), the scheduler over it, the
    reloader over them all, and the doors every listener is opened through."""
    plan = plan_workers(snapshot)
    state_dir = options.state_dir
    private_dir(state_dir)
    if options.owns_process:
        os.environ.update(kernel_cache_env(state_dir))  # inherited by the spawned workers
    store = JobStore(state_dir / STORE_NAME)
    arrays = ArrayStore(array_budget_bytes(snapshot), store, images.namespace_of(state_dir))
    arrays.user_quota_bytes = upload_quota_bytes(snapshot, arrays)
    arrays.restore()
    pool = create_pool(snapshot, plan.specs)
    policy = Policy.from_snapshot(snapshot)
    scheduler = Scheduler(policy, store, arrays, pool, state_dir / OUTPUTS_DIR_NAME)
    status = DaemonStatus(snapshot, plan.backend, plan.fallback_reason)
    services = (pool, scheduler, arrays)
    reloader = Reloader(status, services, notifier, options.settings, options.config)
    state = DaemonState(
        status,
        store,
        arrays,
        pool,
        scheduler,
        reloader.reload,
        Doors(lambda: status.snapshot.config.server, _open_file_limit()),
        Limits(max_upload_bytes=arrays.budget_bytes),
    )
    return state, reloader


def _shm_server(state: DaemonState) -> ShmServer | None:
    """`<socket>.shm`: local clients' own memory, handed over once (memfd/server.py). Each
    uid may hold as much there as the array store's budget. With executor "ray" only on a
    local instance (config.ray.serves_client_memory, docs/ray.md)."""
    if not serves_client_memory(state.status.snapshot.config):
        return None
    return ShmServer(state.scheduler, state.store, state.arrays.budget_bytes, job_request_from)


def private_dir(path: Path) -> None:
    """The state directory, 0700: made so, or narrowed if an older daemon or a person made it
    wider (its files are then out of other users' reach, whatever their own modes)."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if path.stat().st_mode & 0o077:
        path.chmod(0o700)


def _open_file_limit() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]
