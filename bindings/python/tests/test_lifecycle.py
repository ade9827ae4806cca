"""What becomes of leases and acquisitions the way Python code leaves them: a ``Lock`` shared by
tasks and threads, leases dropped without ``release()``, an acquisition cancelled as its grant
arrives or interrupted by Ctrl-C, a forked child; and the package's smaller promises (errors,
option types, an awaitable ``connect``)."""

from __future__ import annotations

import asyncio
import gc
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any, List

import pytest

import leasehold
from conftest import Children, need, unique


# ---- a Lock shared by tasks and threads ----


def test_a_shared_lock_releases_each_tasks_own_lease(store_url: str) -> None:
    """Two tasks enter one ``Lock``; the first hands over early (releases inside its block), the
    second gets a lease; the first's exit must not release the second's."""
    key = unique("shared-tasks")

    async def main() -> None:
        locks = leasehold.connect(store_url, holder="shared")
        other = leasehold.connect(store_url, holder="other")
        lock = locks.lock(key, ttl=10, wait=30)
        first_in, second_in, first_out = asyncio.Event(), asyncio.Event(), asyncio.Event()

        async def first() -> None:
            async with lock as lease:
                first_in.set()
                assert await lease.release() == "released"  # the handoff, inside the block
                await asyncio.wait_for(second_in.wait(), 20)
            first_out.set()

        async def second() -> None:
            await first_in.wait()
            async with lock as lease:
                second_in.set()
                await asyncio.wait_for(first_out.wait(), 20)
                assert lease.is_current, "the first task's exit released the second's lease"
                assert await other.lock(key).try_acquire() is None, "another holder got the key"
                record = await other.inspect(key)
                assert record is not None and record["token"] == lease.token, record
            assert not lease.is_current

        await asyncio.gather(first(), second())
        assert await other.lock(key).try_acquire() is not None

    asyncio.run(main())


def test_a_shared_lock_releases_each_threads_own_lease(store_url: str) -> None:
    key = unique("shared-threads")
    locks = leasehold.connect(store_url, holder="shared")
    other = leasehold.connect(store_url, holder="other")
    lock = locks.lock(key, ttl=10, wait=30)
    first_in, second_in, first_out = threading.Event(), threading.Event(), threading.Event()
    failures: List[BaseException] = []

    def first() -> None:
        with lock as lease:
            first_in.set()
            assert lease.release_sync() == "released"
            assert second_in.wait(20)
        first_out.set()

    def second() -> None:
        assert first_in.wait(20)
        with lock as lease:
            second_in.set()
            assert first_out.wait(20)
            assert lease.is_current, "the first thread's exit released the second's lease"
            assert other.lock(key).try_acquire().result() is None, "another holder got the key"

    def run(f: Any) -> None:
        try:
            f()
        except BaseException as e:  # noqa: B036 (reported below)
            failures.append(e)

    threads = [threading.Thread(target=run, args=(f,)) for f in (first, second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not failures, failures
    got = other.lock(key).try_acquire().result()
    assert got is not None
    got.release_sync()


# ---- leases dropped without release() ----


def _ignore(lease: leasehold.Lease, detail: Any) -> None:
    pass


@pytest.mark.parametrize("how", ["blocking", "blocking-handlers", "async", "async-handlers"])
def test_a_lease_dropped_without_release_frees_its_key(store_url: str, how: str) -> None:
    """Dropped without ``release()`` (handlers or not, with or without an event loop), a lease is
    released at once: another client waiting for the key gets it well before the 60 s TTL (the
    handlers' watchers, a thread or tasks of the loop, do not keep it alive and renewed)."""
    key = unique("dropped")
    a = leasehold.connect(store_url, holder="a")
    b = leasehold.connect(store_url, holder="b")
    handlers: Any = {}
    if how.endswith("handlers"):
        handlers = dict(on_release_requested=_ignore, on_renewal_error=_ignore)

    if how.startswith("blocking"):
        lease = a.lock(key, ttl=60, **handlers).acquire(wait=0).result()
        del lease
        gc.collect()
        got = b.lock(key, ttl=10).acquire(wait=15).result()
        got.release_sync()
        return

    async def main() -> None:
        lease = await a.lock(key, ttl=60, **handlers).acquire(wait=0)
        del lease
        gc.collect()
        got = await b.lock(key, ttl=10).acquire(wait=15)
        await got.release()

    asyncio.run(main())


# ---- Ctrl-C and forks ----


def test_ctrl_c_in_a_blocking_acquire_gives_up_its_place(store_url: str, children: Children) -> None:
    """A waiter interrupted by Ctrl-C (and still running) leaves the line at once: the released
    lease is not kept for it while its 60 s place lasts."""
    key = unique("ctrl-c")
    a = leasehold.connect(store_url, holder="a")
    c = leasehold.connect(store_url, holder="c")
    held = a.lock(key, ttl=30).acquire(wait=0).result()
    child = children.start("interrupt", store_url, key, "interrupted")
    assert children.line(child) == "waiting"
    deadline = time.monotonic() + 20
    while (a.inspect_sync(key) or {}).get("waiter") != "interrupted":
        assert time.monotonic() < deadline, f"the child never stood in line: {a.inspect_sync(key)}"
        time.sleep(0.02)
    child.send_signal(signal.SIGINT)
    assert children.line(child) == "interrupted"
    held.release_sync()
    started = time.monotonic()
    got = c.lock(key, ttl=10).acquire(wait=20).result()
    assert time.monotonic() - started < 15, "the key was kept for the interrupted waiter"
    got.release_sync()
    children.finish(child)


def test_a_forked_child_does_not_take_the_parents_lease_for_its_own(tmp_path: Path) -> None:
    import multiprocessing

    url = f"file://{tmp_path}"
    locks = leasehold.connect(url, holder="parent")
    held = locks.lock("k", ttl=30).acquire(wait=0).result()
    ctx = multiprocessing.get_context("fork")
    queue: "multiprocessing.Queue[str]" = ctx.Queue()

    def child() -> None:
        answers = []
        for name in ("is_current", "fence", "valid_until", "stop_by", "is_handoff_requested"):
            try:
                answers.append(f"{name}: {getattr(held, name)!r}")
            except leasehold.ForkedProcessError:
                answers.append(f"{name}: refused")
        answers.append(repr(held))
        queue.put("\n".join(answers))

    p = ctx.Process(target=child)
    p.start()
    p.join(30)
    assert p.exitcode == 0
    answers = queue.get(timeout=5).split("\n")
    assert answers[:5] == [
        "is_current: refused",
        "fence: refused",
        "valid_until: refused",
        "stop_by: refused",
        "is_handoff_requested: refused",
    ], answers
    assert "fork" in answers[5], answers
    assert held.is_current
    assert (locks.inspect_sync("k") or {}).get("token") == held.token
    held.release_sync()


# ---- a cancel while the grant is in flight ----


@pytest.mark.parametrize("kind", ["redis", "gcs", "k8s"])
def test_a_cancel_as_the_grant_arrives_ends_and_leaves_nothing(kind: str) -> None:
    """A cancelled acquire ends, whenever the cancel comes, and leaves the key free: a cancel in
    the very turn of the loop that brings the grant (the answer there, the task not yet resumed),
    and cancels timed across the whole call, many times."""
    url = need({"redis": "LEASEHOLD_TEST_REDIS", "gcs": "LEASEHOLD_TEST_GCS", "k8s": "LEASEHOLD_TEST_K8S"}[kind])
    key = unique("cancel-race")

    async def main() -> None:
        loop = asyncio.get_running_loop()
        locks = leasehold.connect(url, holder="racer")
        other = leasehold.connect(url, holder="checker")
        seen = {"cancelled": 0, "granted": 0}

        async def ends(task: "asyncio.Task[leasehold.Lease]", what: str) -> None:
            done, _ = await asyncio.wait({task}, timeout=20)
            assert done, f"the acquire cancelled {what} never ended"
            if task.cancelled():
                seen["cancelled"] += 1
            else:
                seen["granted"] += 1
                await task.result().release()
            await loop.run_in_executor(None, leasehold.settle, 5.0)
            got = await other.lock(key, ttl=5).try_acquire()
            assert got is not None, f"cancelled {what}, it left {await other.inspect(key)}"
            await got.release()

        # The cancel in the turn that brings the answer: the loop is kept busy while the answer
        # comes; then the answer's callback and the due timer run in one turn, answer first.
        for _ in range(3):
            task = asyncio.ensure_future(locks.lock(key, ttl=30).acquire(wait=10))
            await asyncio.sleep(0)  # the task sends its request and awaits the answer
            time.sleep(0.3)
            loop.call_later(0, task.cancel)
            await ends(task, "as its answer arrived")
        # Cancels spread over the whole call.
        for i in range(120):
            task = asyncio.ensure_future(locks.lock(key, ttl=30).acquire(wait=10))
            loop.call_later((i % 40) * 0.00005 + (i // 40) * 0.0007, task.cancel)
            await ends(task, f"after {(i % 40) * 0.05 + (i // 40) * 0.7:.2f} ms")
        assert seen["cancelled"] > 0, seen

    asyncio.run(main())


# ---- errors, options, connect ----


def test_a_lock_timeout_is_not_an_os_error(tmp_path: Path) -> None:
    url = f"file://{tmp_path}"
    a = leasehold.connect(url, holder="a")
    b = leasehold.connect(url, holder="b")
    held = a.lock("k", ttl=10).acquire(wait=0).result()
    try:
        with pytest.raises(leasehold.Timeout) as caught:
            try:
                b.lock("k", register_waiter=False).acquire(wait=0.05).result()
            except OSError:
                pytest.fail("except OSError swallowed a lock timeout")
        assert isinstance(caught.value, leasehold.LeaseholdError)
        assert not isinstance(caught.value, (OSError, TimeoutError))
    finally:
        held.release_sync()


def test_a_bool_is_not_a_number_of_seconds(tmp_path: Path) -> None:
    from leasehold import queue

    locks = leasehold.connect(f"file://{tmp_path}")
    with pytest.raises(TypeError, match="bool"):
        locks.lock("k", ttl=True).acquire(wait=0).result()  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="bool"):
        locks.lock("k").acquire(wait=True).result()  # type: ignore[arg-type]
    q = queue.connect(f"sqlite://{tmp_path / 'q.db'}", locks=f"file://{tmp_path / 'locks'}")

    async def handle(task: queue.Task) -> None:
        pass

    with pytest.raises(TypeError, match="bool"):
        q.worker(handle, ttl=True)
    with pytest.raises(leasehold.InvalidOption) as zero:
        q.worker(handle, ttl=0)
    assert zero.value.option == "ttl"


def test_connect_async_lets_the_loop_run_and_no_credentials_is_not_retryable(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``gs://`` with no credential anywhere: the awaitable connect lets the loop go on while the
    credential chain is searched, and the error says a retry will not help."""
    for name in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "CLOUDSDK_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "gcloud"))
    monkeypatch.setenv("PATH", os.defpath)

    async def main() -> None:
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.ensure_future(ticker())
        started = time.monotonic()
        with pytest.raises(leasehold.LeaseholdError) as caught:
            await leasehold.connect_async("gs://no-such-bucket/locks?timeout=30s")
        took = time.monotonic() - started
        t.cancel()
        assert not caught.value.retryable, caught.value
        assert "no Google credentials" in str(caught.value)
        # The loop ran on meanwhile (a blocked loop ticks once).
        assert ticks >= min(took, 1.0) * 20, (ticks, took)
        locks = await leasehold.connect_async(need("LEASEHOLD_TEST_REDIS"), holder="async")
        assert locks.holder == "async"

    asyncio.run(main())
