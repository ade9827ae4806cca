"""Semaphores and read-write locks from Python on real stores (files, Redis, the Kubernetes Lease
API server, the Cloud Storage emulator), in one process and across processes, as the locks are
tested in ``test_locks.py``."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import List, Set

import pytest

import leasehold
from conftest import Children, unique


def test_a_semaphore_has_at_most_n_holders_and_fences_rise(store_url: str) -> None:
    key = unique("sem")
    a = leasehold.connect(store_url, holder="a")
    b = leasehold.connect(store_url, holder="b")
    first = a.semaphore(key, 2, ttl=10).acquire(wait=0).result()
    second = b.semaphore(key, 2, ttl=10).try_acquire().result()
    assert second is not None and second.fence > first.fence
    assert a.semaphore(key, 2).try_acquire().result() is None, "both permits are held"
    with pytest.raises(leasehold.Timeout) as caught:
        b.semaphore(key, 2, register_waiter=False).acquire(wait=0.2).result()
    assert caught.value.key == key and not caught.value.retryable
    with pytest.raises(leasehold.InvalidOption) as other:
        a.semaphore(key, 3).try_acquire().result()
    assert other.value.option == "permits", "every caller names the same count"
    assert first.release_sync() == "released"
    with b.semaphore(key, 2, ttl=10).acquire(wait=5) as third:
        assert third.fence > second.fence and third.is_current
    assert not third.is_current
    second.release_sync()
    with pytest.raises(leasehold.InvalidOption):
        a.semaphore(unique("sem0"), 0).try_acquire().result()
    with pytest.raises(leasehold.InvalidOption):
        a.semaphore(unique("sem-neg"), -1).try_acquire().result()


def test_read_shares_with_read_and_write_excludes_both(store_url: str) -> None:
    key = unique("rw")
    a = leasehold.connect(store_url, holder="a")
    b = leasehold.connect(store_url, holder="b")
    rw_a, rw_b = a.read_write(key, ttl=10), b.read_write(key, ttl=10)
    r1 = rw_a.read().acquire(wait=0).result()
    r2 = rw_b.read().try_acquire().result()
    assert r2 is not None and r2.fence > r1.fence, "readers share"
    assert rw_b.write().try_acquire().result() is None, "readers exclude the writer"
    r1.release_sync()
    r2.release_sync()
    with rw_b.write().acquire(wait=5) as w:
        assert w.fence > r2.fence
        assert rw_a.read().try_acquire().result() is None, "the writer excludes readers"
        assert rw_a.write().try_acquire().result() is None, "and writers"
        with pytest.raises(leasehold.Timeout) as caught:
            a.read_write(key, register_waiter=False).read().acquire(wait=0.2).result()
        assert caught.value.key == key
    again = rw_a.read().try_acquire().result()
    assert again is not None and again.fence > w.fence, "fences rise across reads and writes"
    again.release_sync()


def test_async_permits_waiters_and_cancel(store_url: str) -> None:
    key, rw_key = unique("sem-async"), unique("rw-async")

    async def main() -> None:
        a = leasehold.connect(store_url, holder="a")
        b = leasehold.connect(store_url, holder="b")
        async with a.semaphore(key, 1, ttl=10) as held:
            # A waiter is granted the permit when it is released.
            waiting = asyncio.ensure_future(b.semaphore(key, 1, ttl=10).acquire(wait=20))
            assert await asyncio.wait_for(held.handoff_requested(), 20) == "b"
            assert not waiting.done()
        got = await asyncio.wait_for(waiting, 20)
        assert got.fence > held.fence and got.holder == "b"
        # A wait cancelled by asyncio leaves no holder and no waiter behind.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(a.semaphore(key, 1).acquire(), 0.2)
        await asyncio.get_running_loop().run_in_executor(None, leasehold.settle, 5.0)
        assert await got.release() == "released"
        after = await a.semaphore(key, 1).try_acquire()
        assert after is not None, f"the cancelled wait left {await a.inspect(key)}"
        await after.release()

        # Read-write: a writer waits for the reader, and readers coming after it wait behind it.
        reader = await a.read_write(rw_key, ttl=10).read().acquire(wait=0)
        writer = asyncio.ensure_future(b.read_write(rw_key, ttl=10).write().acquire(wait=20))
        assert await asyncio.wait_for(reader.handoff_requested(), 20) == "b"
        c = leasehold.connect(store_url, holder="c")
        assert await c.read_write(rw_key).read().try_acquire() is None, "not ahead of the writer"
        await reader.release()
        w = await asyncio.wait_for(writer, 20)
        assert w.fence > reader.fence
        with pytest.raises(leasehold.Timeout):
            await a.read_write(rw_key, register_waiter=False).read().acquire(wait=0.2)
        await w.release()

    asyncio.run(main())


def overlaps(log: Path) -> List[Set[str]]:
    """The sets of permits held at once, from a log of ``in``/``out`` lines; checks that each
    process's fences rise."""
    held: Set[str] = set()
    seen: List[Set[str]] = []
    last = {}
    for line in log.read_text().splitlines():
        what, fence, pid, kind = line.split()
        tag = f"{kind}/{pid}/{fence}"
        if what == "in":
            assert int(fence) > last.get(pid, 0), f"fences rise: {line}"
            last[pid] = int(fence)
            held.add(tag)
            seen.append(set(held))
        else:
            held.remove(tag)
    return seen


def test_processes_share_a_semaphore_and_a_read_write_lock(
    store_url: str, tmp_path: Path, children: Children
) -> None:
    sem, rw = unique("sem-procs"), unique("rw-procs")
    sem_log, rw_log = tmp_path / "sem", tmp_path / "rw"
    procs = [children.start("permits", store_url, sem, "semaphore:2", "4", str(sem_log)) for _ in range(3)]
    procs += [children.start("permits", store_url, rw, kind, "4", str(rw_log)) for kind in ("read", "read", "write")]
    for p in procs:
        children.finish(p, timeout=180)
    sems = overlaps(sem_log)
    assert len(sems) == 12 and max(len(s) for s in sems) <= 2, sems
    rws = overlaps(rw_log)
    assert len(rws) == 12
    for s in rws:
        kinds = [t.split("/")[0] for t in s]
        assert "write" not in kinds or len(kinds) == 1, f"a writer shared the lock: {s}"
