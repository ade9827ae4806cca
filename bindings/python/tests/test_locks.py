"""Locks from Python on real stores: files, Redis, the Kubernetes Lease API server and the Cloud
Storage emulator, across Python processes."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

import leasehold
from conftest import Children, Proxy, need, unique


def test_acquire_release_and_fences_rise(store_url: str) -> None:
    key = unique("fences")
    a = leasehold.connect(store_url, holder="a")
    b = leasehold.connect(store_url, holder="b")
    fences = []
    for _ in range(3):
        with a.lock(key, ttl=10).acquire(wait=0) as lease:
            assert lease.is_current and lease.holder == "a" and lease.key == key
            assert b.lock(key).try_acquire().result() is None, "held by a"
            now = time.monotonic()
            assert now < lease.stop_by <= lease.valid_until <= now + 10
            record = b.inspect_sync(key)
            assert record is not None and record["holder"] == "a" and record["fence"] == lease.fence
            fences.append(lease.fence)
        assert not lease.is_current
        assert lease.release_sync() == "already released", "release is idempotent"
    assert fences == sorted(set(fences)), f"fences rise strictly: {fences}"
    got = b.lock(key).try_acquire().result()
    assert got is not None and got.fence > fences[-1]
    got.release_sync()


def test_async_lock_and_timeout_naming_the_holder(store_url: str) -> None:
    key = unique("async")

    async def main() -> None:
        a = leasehold.connect(store_url, holder="a")
        b = leasehold.connect(store_url, holder="b")
        async with a.lock(key, ttl=10, wait=5) as lease:
            assert lease.fence > 0
            with pytest.raises(leasehold.Timeout) as caught:
                await b.lock(key, register_waiter=False).acquire(wait=0.2)
            assert caught.value.holder == "a" and caught.value.key == key
            assert caught.value.waited >= 0.2 and not caught.value.retryable
            assert await b.lock(key).try_acquire() is None
        lease2 = await b.lock(key).acquire(wait=5)
        assert lease2.fence > lease.fence
        assert await lease2.release() == "released"

    asyncio.run(main())


def test_two_processes_take_turns(store_url: str, tmp_path: Path, children: Children) -> None:
    key = unique("turns")
    log = str(tmp_path / "log")
    procs = [children.start("cycle", store_url, key, "5", log) for _ in range(2)]
    for p in procs:
        children.finish(p, timeout=120)
    lines = Path(log).read_text().split()
    events = [lines[i : i + 3] for i in range(0, len(lines), 3)]
    assert len(events) == 20, events
    last = 0
    for i in range(0, 20, 2):
        (into, f1, p1), (out, f2, p2) = events[i], events[i + 1]
        assert (into, out) == ("in", "out") and (f1, p1) == (f2, p2), f"overlap at {i}: {events}"
        assert int(f1) > last, f"fences rise: {events}"
        last = int(f1)
    assert len({e[2] for e in events}) == 2, "both processes took the lease"


def test_handoff_requested_when_another_process_waits(store_url: str, children: Children) -> None:
    key = unique("handoff")

    async def main() -> None:
        locks = leasehold.connect(store_url, holder="owner")
        requested = asyncio.Event()
        seen = []

        def on_release_requested(lease: leasehold.Lease, waiter: str) -> None:
            seen.append(waiter)
            requested.set()

        lease = await locks.lock(key, ttl=3, on_release_requested=on_release_requested).acquire(wait=0)
        assert not lease.is_handoff_requested
        child = children.start("wait", store_url, key, "waiter-1")
        assert children.line(child) == "waiting"
        assert await asyncio.wait_for(lease.handoff_requested(), 20) == "waiter-1"
        await asyncio.wait_for(requested.wait(), 5)
        assert seen == ["waiter-1"] and lease.is_handoff_requested
        assert await lease.release() == "released"
        got = children.line(child)
        assert got.startswith("got ") and int(got.split()[1]) > lease.fence
        children.finish(child)

    asyncio.run(main())


def test_lost_fires_when_the_store_is_cut_off(proxy: Proxy) -> None:
    key = unique("cut")

    async def main() -> None:
        locks = leasehold.connect(proxy.url, holder="cut")
        errors = []
        handled = asyncio.Event()

        def on_renewal_error(lease: leasehold.Lease, error: leasehold.LeaseLost) -> None:
            errors.append(error)
            handled.set()

        lease = await locks.lock(key, ttl=1.5, on_renewal_error=on_renewal_error).acquire(wait=0)
        proxy.pause()
        stop = await asyncio.wait_for(lease.must_stop(), 10)
        assert time.monotonic() <= lease.valid_until + 0.5, stop
        reason = await asyncio.wait_for(lease.lost(), 10)
        assert "unreachable" in reason and not lease.is_current
        await asyncio.wait_for(handled.wait(), 5)
        assert isinstance(errors[0], leasehold.LeaseLost) and errors[0].key == key
        proxy.resume()
        # The lease expired in the store meanwhile: another client takes it at once.
        other = leasehold.connect(need("LEASEHOLD_TEST_REDIS"), holder="next")
        got = await other.lock(key, ttl=5).acquire(wait=5)
        assert got.fence > lease.fence
        await got.release()

    asyncio.run(main())


def test_a_lease_lost_inside_a_block_raises_on_exit(store_url: str) -> None:
    key = unique("lost")
    locks = leasehold.connect(store_url, holder="victim")
    operator = leasehold.connect(store_url, holder="operator")

    async def unhandled() -> None:
        async with locks.lock(key, ttl=1.5) as lease:
            assert (await operator.force_release(key) or {}).get("holder") == "victim"
            reason = await asyncio.wait_for(lease.must_stop(), 10)
            assert not lease.is_current, reason

    with pytest.raises(leasehold.LeaseLost) as caught:
        asyncio.run(unhandled())
    assert caught.value.key == key and "released by someone else" in caught.value.reason

    async def handled() -> None:
        async with locks.lock(key, ttl=1.5) as lease:
            await operator.force_release(key)
            assert "released by someone else" in await asyncio.wait_for(lease.lost(), 10)

    asyncio.run(handled())  # awaited lost(): the block handled the loss, no exception


def test_cancelled_acquire_leaves_no_waiter_and_no_grant(store_url: str) -> None:
    key = unique("cancel")

    async def main() -> None:
        a = leasehold.connect(store_url, holder="a")
        b = leasehold.connect(store_url, holder="b")
        held = await a.lock(key, ttl=10).acquire(wait=0)
        # The form: a wait cut short by asyncio.
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(b.lock(key).acquire(), 0.01)
        # A waiter whose registration is in the store, then cancelled.
        task = asyncio.ensure_future(b.lock(key, waiter_ttl=10).acquire())
        deadline = time.monotonic() + 20
        while ((await a.inspect(key)) or {}).get("waiter") != "b":
            assert time.monotonic() < deadline, "b never registered as waiter"
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.get_running_loop().run_in_executor(None, leasehold.settle, 5.0)
        record = await a.inspect(key)
        assert record is not None and record["holder"] == "a"
        assert record["waiter"] is None and not record.get("queue"), record
        await held.release()
        # An acquisition of a free key cancelled while in flight: nothing stays taken.
        for _ in range(5):
            task = asyncio.ensure_future(b.lock(key, ttl=30).acquire())
            await asyncio.sleep(0)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                pass
            else:
                await task.result().release()
            await asyncio.get_running_loop().run_in_executor(None, leasehold.settle, 5.0)
            again = await a.lock(key, ttl=5).try_acquire()
            assert again is not None, f"the cancelled acquisition left {await a.inspect(key)}"
            await again.release()

    asyncio.run(main())


def test_bad_input_gets_typed_errors(tmp_path: Path) -> None:
    with pytest.raises(leasehold.InvalidUrl) as url:
        leasehold.connect("nosuch://x")
    assert not url.value.retryable
    locks = leasehold.connect(f"file://{tmp_path}")
    with pytest.raises(leasehold.InvalidKey):
        locks.lock("").acquire(wait=0).result()
    with pytest.raises(leasehold.InvalidKey):
        locks.lock("a\x00b").try_acquire().result()
    with pytest.raises(leasehold.InvalidOption):
        locks.lock("k", ttl=-1).acquire().result()
    with pytest.raises(leasehold.InvalidOption):
        locks.lock("k", ttl=float("nan")).acquire().result()
    with pytest.raises(leasehold.Unavailable) as down:
        leasehold.connect("redis://127.0.0.1:1?timeout=200ms").lock("k").acquire(wait=0.5).result()
    assert down.value.retryable


def test_a_fork_after_use_is_refused(tmp_path: Path) -> None:
    import multiprocessing

    locks = leasehold.connect(f"file://{tmp_path}")
    locks.lock("k").acquire(wait=0).result().release_sync()
    ctx = multiprocessing.get_context("fork")
    queue: "multiprocessing.Queue[str]" = ctx.Queue()

    def child() -> None:
        try:
            locks.lock("k").try_acquire().result()
            queue.put("no error")
        except leasehold.ForkedProcessError as e:
            queue.put(f"refused: {e}")

    p = ctx.Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    assert queue.get(timeout=5).startswith("refused: leasehold started its runtime")


def test_handlers_of_a_lease_taken_without_an_event_loop(store_url: str, children: Children) -> None:
    import threading

    key = unique("sync-handlers")
    locks = leasehold.connect(store_url, holder="sync-owner")
    operator = leasehold.connect(store_url, holder="operator")
    requested = threading.Event()
    lost = threading.Event()
    seen = {}

    def on_release_requested(lease: leasehold.Lease, waiter: str) -> None:
        seen["waiter"] = waiter
        seen["released"] = lease.release_sync()  # from the handler's own thread
        requested.set()

    with locks.lock(key, ttl=3, on_release_requested=on_release_requested).acquire(wait=0) as lease:
        child = children.start("wait", store_url, key, "sync-waiter")
        assert children.line(child) == "waiting"
        assert requested.wait(20), "on_release_requested was not called"
        assert seen == {"waiter": "sync-waiter", "released": "released"} and not lease.is_current
        got = children.line(child)
        assert got.startswith("got ") and int(got.split()[1]) > lease.fence
        children.finish(child)

    def on_renewal_error(lease: leasehold.Lease, error: leasehold.LeaseLost) -> None:
        seen["lost"] = error.reason
        lost.set()

    with locks.lock(key, ttl=1.5, on_renewal_error=on_renewal_error).acquire(wait=10) as lease:
        assert operator.force_release_sync(key) is not None
        assert lost.wait(10), "on_renewal_error was not called"
        assert "released by someone else" in seen["lost"] and not lease.is_current
    # handled by on_renewal_error: the block did not raise LeaseLost
