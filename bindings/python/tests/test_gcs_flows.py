"""The single-waiter Cloud Storage lock service's flows, as its design draws them, written with
the package on the Cloud Storage emulator: the standard lifecycle, the handoff to one waiter
through ``on_release_requested``, and a lock lost or stolen calling ``on_renewal_error``. The
thief and the deleter use Google's own client, as that service does."""

from __future__ import annotations

import asyncio
import json
import os
import time
from typing import Any, List
from urllib.parse import urlparse

import leasehold
from conftest import Children, need, unique


def bucket_and_prefix() -> "tuple[str, str]":
    url = urlparse(need("LEASEHOLD_TEST_GCS"))
    return url.netloc, url.path.strip("/")


def blob(name: str) -> Any:
    """The object ``name`` through google-cloud-storage on the emulator."""
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    os.environ["STORAGE_EMULATOR_HOST"] = need("LEASEHOLD_TEST_GCS_EMULATOR")
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket, prefix = bucket_and_prefix()
    return client.bucket(bucket).blob(f"{prefix}/{name}")


def retried(act: Any, key: str) -> Any:
    """``act(blob)`` on a fresh read of the object, again when a renewal rewrote it in between
    (what that service's client does on ``PreconditionFailed``)."""
    from google.api_core import exceptions

    for _ in range(20):
        obj = blob(key)
        try:
            obj.reload()
            return act(obj)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            continue
    raise AssertionError(f"the object of {key} kept changing")


def read(key: str) -> "tuple[int, Any]":
    """The object's generation and JSON body."""
    return retried(lambda obj: (obj.generation, json.loads(obj.download_as_bytes(if_generation_match=obj.generation))), key)


def test_standard_lifecycle_acquire_renew_release() -> None:
    key = unique("lifecycle")
    locks = leasehold.connect(need("LEASEHOLD_TEST_GCS"), holder="process-a")

    async def main() -> None:
        lease = await locks.lock(key, ttl=1.5).acquire(wait=0)
        generation, first = read(key)
        assert first["ownerId"] == "process-a", first  # the service's own schema
        # Background renewal: the object is rewritten (a new generation) with a later expiry.
        # (A read's generation and body come from two requests, so a renewal between them can
        # pair the body of one generation with the number of the next: wait for both to move.)
        deadline = time.monotonic() + 10
        while True:
            generation2, second = read(key)
            if second["expiresAt"] > first["expiresAt"] and generation2 != generation:
                break
            assert time.monotonic() < deadline, "never renewed"
            await asyncio.sleep(0.05)
        assert lease.is_current
        assert await lease.release() == "released"
        record = await locks.inspect(key)
        assert record is None or record["holder"] is None, record

    asyncio.run(main())


def test_handoff_to_one_waiter_through_on_release_requested(children: Children) -> None:
    key = unique("handoff")
    url = need("LEASEHOLD_TEST_GCS")

    async def main() -> None:
        locks = leasehold.connect(url, holder="process-a")
        checkpointed = asyncio.Event()
        waiters: List[str] = []

        async def on_release_requested(lease: leasehold.Lease, waiter: str) -> None:
            waiters.append(waiter)
            await asyncio.sleep(0.05)  # the graceful checkpoint
            await lease.release()
            checkpointed.set()

        lease = await locks.lock(key, ttl=3, on_release_requested=on_release_requested).acquire(wait=0)
        child = children.start("wait", url, key, "process-b")
        assert children.line(child) == "waiting"
        await asyncio.wait_for(checkpointed.wait(), 30)
        assert waiters == ["process-b"] and not lease.is_current
        got = children.line(child)
        assert got.startswith("got ") and int(got.split()[1]) > lease.fence
        children.finish(child)

    asyncio.run(main())


def test_the_books_handoff_stops_the_work_before_the_waiter_gets_the_lock(children: Children) -> None:
    """The book's example (python.md), as written: the handler stops the work, the block ends and
    releases; the waiter is granted the lock only after the work stopped, and the handler fired
    within ``renew_every`` (2 s) of the waiter's arrival, not ``ttl / 3`` (20 s)."""
    key = unique("book")
    url = need("LEASEHOLD_TEST_GCS")
    stopped: List[float] = []

    async def run_job(fence: int) -> None:
        try:
            await asyncio.sleep(3600)  # the work, under the lease
        finally:
            stopped.append(time.monotonic())  # the checkpoint: no work after this

    async def main() -> "tuple[Any, float]":
        locks = await leasehold.connect_async(url, holder="process-a")
        work: "asyncio.Task[None] | None" = None

        def stop_work(lease: leasehold.Lease, detail: Any) -> None:
            if work is not None:
                work.cancel()

        async with locks.lock(key, ttl=60, renew_every=2, on_release_requested=stop_work,
                              on_renewal_error=stop_work) as lease:
            work = asyncio.ensure_future(run_job(lease.fence))
            child = children.start("wait", url, key, "process-b")
            assert children.line(child) == "waiting"
            arrived = time.monotonic()
            try:
                await work
            except asyncio.CancelledError:
                if not work.cancelled():
                    raise
        return child, arrived

    child, arrived = asyncio.run(main())
    got = children.line(child).split()
    granted = float(got[2])
    assert stopped and stopped[0] < granted, f"the waiter got the lock at {granted}, the work ran until {stopped}"
    # Within a renewal period of the waiter's arrival (its start-up and a round trip aside).
    assert stopped[0] - arrived < 2 + 4, stopped[0] - arrived
    children.finish(child)


def test_lost_and_stolen_call_on_renewal_error() -> None:
    url = need("LEASEHOLD_TEST_GCS")

    async def run(key: str, act: Any) -> leasehold.LeaseLost:
        locks = leasehold.connect(url, holder="process-a")
        errors: List[leasehold.LeaseLost] = []
        called = asyncio.Event()

        def on_renewal_error(lease: leasehold.Lease, error: leasehold.LeaseLost) -> None:
            errors.append(error)
            called.set()

        lease = await locks.lock(key, ttl=1.5, on_renewal_error=on_renewal_error).acquire(wait=0)
        retried(act, key)
        await asyncio.wait_for(called.wait(), 10)
        assert not lease.is_current and len(errors) == 1
        await lease.release()  # stops the background tasks; the lease is not ours
        return errors[0]

    def delete(obj: Any) -> None:  # lost: the object deleted under its owner
        obj.delete(if_generation_match=obj.generation)

    def steal(obj: Any) -> None:  # stolen: overwritten by another process of that service
        body = {"ownerId": "process-c", "expiresAt": time.time() + 60, "waitingOwnerId": None, "waiterExpiresAt": None}
        obj.upload_from_string(json.dumps(body), content_type="application/json", if_generation_match=obj.generation)

    lost = asyncio.run(run(unique("lost"), delete))
    assert "released by someone else" in lost.reason, lost
    stolen = asyncio.run(run(unique("stolen"), steal))
    assert "taken over by process-c" in stolen.reason, stolen
