"""The array store's bounds, on the real store and real /dev/shm images (a daemon for the
config keys and the body timeout): an upload makes room only from its own owner's pending
arrays, and one in progress holds what it reserved until it ends, however it ends."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from collections.abc import AsyncIterator, Callable, Iterator

import numpy as np
import pytest

from taogpud import wire
from taogpud.arrayfiles import images
from taogpud.arrayfiles.store import ArrayStore
from taogpud.errors import ArrayStoreFull, ArrayTooLarge, BodyTooLarge
from taogpud.jobs.records import Peer
from taogpud.testing import CPU_CONFIG, InProcessDaemon, deep_merge, to_toml

ALICE, CAROL = Peer(uid=1001, gid=1001), Peer(uid=1002, gid=1002)
ARRAY_BYTES = 128 + 4000  # header and data of 1,000 float32


@pytest.fixture
def store() -> Iterator[ArrayStore]:
    """Room for three arrays in all, two pending per user."""
    arrays = ArrayStore(
        3 * ARRAY_BYTES, namespace="test-array-store", user_quota_bytes=2 * ARRAY_BYTES
    )
    yield arrays
    arrays.release_unused()  # every image it made (no test leaves one pinned)


def upload(store: ArrayStore, owner: Peer) -> str:
    npy = wire.npy_header((1000,), "<f4") + np.ones(1000, np.float32).tobytes()

    async def body() -> AsyncIterator[bytes]:
        yield npy

    array_id, _ = asyncio.run(store.upload(body(), 1 << 20, owner=owner))
    return array_id


def test_an_upload_evicts_its_owners_oldest_pending_array_past_the_quota(store: ArrayStore) -> None:
    first, second = upload(store, ALICE), upload(store, ALICE)
    third = upload(store, ALICE)
    assert store.get(first) is None and store.get(second) and store.get(third)
    assert store.pending_bytes(ALICE.uid) == 2 * ARRAY_BYTES


def test_a_full_budget_refuses_rather_than_evict_another_users_array(store: ArrayStore) -> None:
    """alice holds two, carol one (the whole budget): carol's next upload may evict only her
    own; alice's arrays stay even when that leaves carol without room."""
    alice = [upload(store, ALICE), upload(store, ALICE)]
    carols = upload(store, CAROL)
    store.pin([carols])  # a queued job uses it: not hers to evict either
    with pytest.raises(ArrayStoreFull, match="other users' uploads"):
        upload(store, CAROL)
    assert all(store.get(array_id) for array_id in [*alice, carols])
    store.unpin([carols])
    replacing = upload(store, CAROL)  # her own pending one goes
    assert store.get(carols) is None and store.get(replacing)
    assert all(store.get(array_id) for array_id in alice)


def test_an_array_past_the_quota_is_refused_with_the_numbers(store: ArrayStore) -> None:
    npy = wire.npy_header((3000,), "<f4") + bytes(12000)

    async def body() -> AsyncIterator[bytes]:
        yield npy

    with pytest.raises(ArrayTooLarge, match=f"quota of {2 * ARRAY_BYTES} bytes"):
        asyncio.run(store.upload(body(), 1 << 20, owner=ALICE))


def test_another_users_id_is_none_for_them_and_known_to_root(store: ArrayStore) -> None:
    array_id = upload(store, ALICE)
    assert store.get_for(array_id, CAROL) is None
    assert store.get_for(array_id, ALICE) is not None
    assert store.get_for(array_id, Peer(uid=0, gid=0)) is not None


def test_a_body_past_the_upload_limit_is_a_413(store: ArrayStore) -> None:
    """A chunked upload (no length to refuse it by) longer than the limit: body_too_large."""
    npy = wire.npy_header((10,), "<f4") + bytes(40)

    async def body() -> AsyncIterator[bytes]:
        yield npy
        for _ in range(4):
            yield bytes(1024)

    with pytest.raises(BodyTooLarge) as refused:
        asyncio.run(store.upload(body(), 2048, owner=ALICE))
    assert refused.value.http_status == 413 and store.pending_bytes(ALICE.uid) == 0


def test_the_quota_is_in_status_and_a_reload_changes_it(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """memory.upload_quota_mb shows in status as user_quota_bytes and applies live."""
    daemon = inprocess_factory(config={"memory": {"upload_quota_mb": 1}})
    with daemon.client() as client:
        assert client.status()["arrays"]["user_quota_bytes"] == 1 << 20
        daemon.config_path.write_text(
            to_toml(deep_merge(CPU_CONFIG, {"memory": {"upload_quota_mb": 3}}))
        )
        assert client.reload_config()["ok"]
        assert client.status()["arrays"]["user_quota_bytes"] == 3 << 20


class HeldUpload:
    """An upload whose body stops after its first 8 KiB until `finish` or `abort`: the
    reservation a client makes by sending a header and holding the connection."""

    def __init__(self, store: ArrayStore, owner: Peer) -> None:
        self.npy = wire.npy_header((1000,), "<f4") + np.ones(1000, np.float32).tobytes()
        self._go_on = asyncio.Event()
        self._abort = False
        self.task = asyncio.create_task(store.upload(self._body(), 1 << 20, owner=owner))

    async def _body(self) -> AsyncIterator[bytes]:
        yield self.npy[:2048]
        yield self.npy[2048:3000]  # the header is read from the first 4 KiB
        yield self.npy[3000:4096]
        await self._go_on.wait()
        if self._abort:
            raise ConnectionResetError("the client hung up")  # what starlette raises differs
        yield self.npy[4096:]

    def release(self, abort: bool) -> None:
        self._abort = abort
        self._go_on.set()


async def _upload_now(store: ArrayStore, owner: Peer) -> str:
    npy = wire.npy_header((1000,), "<f4") + np.ones(1000, np.float32).tobytes()

    async def body() -> AsyncIterator[bytes]:
        yield npy

    array_id, _ = await store.upload(body(), 1 << 20, owner=owner)
    return array_id


async def _until_reserved(store: ArrayStore, nbytes: int) -> None:
    while store.view(ALICE)["reserved_bytes"] != nbytes:
        await asyncio.sleep(0.001)


def _images(namespace: str) -> list[str]:
    return sorted(path.name for path in images.SHM_DIR.glob(f"{images.PREFIX}{namespace}.*"))


def test_uploads_in_progress_count_against_the_budget_and_their_owners_quota() -> None:
    """Alice holds two uploads mid-body: their bytes are reserved from the moment the header
    is read, so her third is refused by her quota and carol's second (her first in use by a
    job) by the budget (before, all were taken and status said nothing was used). Alice
    hanging up one and finishing the other gives the reservations back; the aborted image
    is gone."""
    namespace = f"test-held-{os.getpid()}"
    store = ArrayStore(3 * ARRAY_BYTES, namespace=namespace, user_quota_bytes=2 * ARRAY_BYTES)

    async def scenario() -> None:
        held = [HeldUpload(store, ALICE), HeldUpload(store, ALICE)]
        await _until_reserved(store, 2 * ARRAY_BYTES)
        assert store.view(ALICE)["your_reserved_bytes"] == 2 * ARRAY_BYTES
        assert store.view(CAROL)["your_reserved_bytes"] == 0
        with pytest.raises(ArrayStoreFull, match="quota"):
            await _upload_now(store, ALICE)
        carols = await _upload_now(store, CAROL)
        store.pin([carols])  # a queued job uses it: she has nothing of her own to evict
        with pytest.raises(ArrayStoreFull, match="reserved by uploads still in progress"):
            await _upload_now(store, CAROL)
        store.unpin([carols])
        assert len(_images(namespace)) == 3  # never more than the budget holds
        held[0].release(abort=True)
        held[1].release(abort=False)
        with pytest.raises(ConnectionResetError):
            await held[0].task
        alices, _ = await held[1].task
        assert store.view(ALICE)["reserved_bytes"] == 0
        assert store.used_bytes == 2 * ARRAY_BYTES
        assert _images(namespace) == sorted(
            store.get(array_id).name for array_id in (carols, alices)
        )

    try:
        asyncio.run(scenario())
    finally:
        store.release_unused()
        for name in _images(namespace):
            images.unlink(name)


def test_an_upload_the_body_timeout_cuts_gives_its_reservation_back(
    inprocess_factory: Callable[..., InProcessDaemon],
) -> None:
    """An upload held mid-body past server.body_timeout_s: the daemon answers 408 and
    closes, and its reservation and partial file go with it, the client still connected."""
    daemon = inprocess_factory(config={"server": {"body_timeout_s": 1}})
    npy_head = wire.npy_header((1 << 18,), "<f4")
    head = (
        f"POST /v1/arrays HTTP/1.1\r\nHost: localhost\r\n"
        f"Content-Type: application/octet-stream\r\nContent-Length: {len(npy_head) + (1 << 20)}"
        "\r\n\r\n"
    )
    pattern = f"{images.PREFIX}{images.namespace_of(daemon.state_dir)}.*"
    with daemon.client() as client, socket.socket(socket.AF_UNIX) as held:
        held.connect(str(daemon.socket_path))
        held.sendall(head.encode() + npy_head + bytes(64 * 1024))
        answer = held.recv(4096)  # the daemon's, once the timeout has cut the body
        assert answer.startswith(b"HTTP/1.1 408"), answer
        deadline = time.monotonic() + 60  # the release follows the close; a bound, not a speed
        while client.status()["arrays"]["reserved_bytes"] and time.monotonic() < deadline:
            time.sleep(0.02)
        assert client.status()["arrays"]["reserved_bytes"] == 0
        assert list(images.SHM_DIR.glob(pattern)) == []
