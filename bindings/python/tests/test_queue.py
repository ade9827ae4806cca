"""``leasehold.queue``: the per-user queue as the orchestrator service uses it (4 slots, one task
per user at a time, priorities, its status JSON), cancel, and a Python worker: fences, and the
handler cancelled at the stop-by deadline and abandoned at ``valid_until``.

Each test runs on SQLite and on the harness's PostgreSQL; workers take their leases where
``leasehold queue work`` would (PostgreSQL: the same database) except where a test must cut the
lease store off: there a file store in ``tmp_path``, whose renewals a child process blocks by
holding the record file's mutation lock (byte 1, a POSIX lock conflicting with the store's OFD
lock).
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
import uuid
from collections import defaultdict
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

from conftest import cli
from leasehold import InvalidKey, InvalidOption, NotFound, queue

# A child that holds the mutation lock of a file store's record until its stdin closes.
BLOCK_RENEWALS = (
    "import fcntl, sys\n"
    "f = open(sys.argv[1], 'r+')\n"
    "fcntl.lockf(f, fcntl.LOCK_EX, 1, 1)\n"
    "print('locked', flush=True)\n"
    "sys.stdin.read()\n"
)


def users(n: int) -> List[str]:
    """``n`` user keys no other test uses (the PostgreSQL queue is shared by the run)."""
    tag = uuid.uuid4().hex[:8]
    return [f"user{i}-{tag}" for i in range(n)]


def open_queue(url: str, tmp_path: Path, *, file_locks: bool = False) -> queue.Queue:
    """The queue; its workers' leases from the default place (SQLite: a file store in
    ``tmp_path``, not the user's state directory), or a file store with ``file_locks``."""
    if file_locks or url.startswith("sqlite:"):
        return queue.connect(url, locks=f"file://{tmp_path / 'locks'}")
    return queue.connect(url)


def cli_status(url: str) -> Dict[str, Any]:
    out = subprocess.run(
        [cli(), "queue", "--queue", url, "status", "--json"],
        capture_output=True, text=True, timeout=30,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


async def wait_for(event: asyncio.Event, what: str, timeout: float = 10) -> None:
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except asyncio.TimeoutError:
        raise AssertionError(f"{what} did not happen within {timeout} s") from None


class Blocker:
    """A child process holding the mutation lock of ``key``'s record in the file store at
    ``locks``: the key's lease cannot be renewed until :meth:`release`."""

    def __init__(self, locks: Path, key: str) -> None:
        self.path = locks / f"{key}.lease"
        self.proc: Optional[asyncio.subprocess.Process] = None

    async def hold(self) -> None:
        assert self.path.is_file(), self.path
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", BLOCK_RENEWALS, str(self.path),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        )
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), 10)
        assert line == b"locked\n", line

    async def release(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            await self.proc.wait()


def test_per_user_queue_four_slots_one_task_per_user(queue_url: str, tmp_path: Path) -> None:
    """The orchestrator's queue: at most 4 tasks at once, never two of one user; while 4 run, the
    status shows the slots full with one task per user, as the capacity view too."""
    q = open_queue(queue_url, tmp_path)
    names = users(6)
    ids = {}
    for round_ in range(2):
        for i, u in enumerate(names):
            ids[q.add_sync(u, {"user": u, "round": round_}, group=f"project{i % 2}")] = u
    running: Dict[str, int] = defaultdict(int)
    most = {"all": 0, "user": 0}
    seen: Dict[int, int] = {}

    async def handle(task: queue.Task) -> None:
        running[task.key] += 1
        total = sum(running.values())
        most["all"] = max(most["all"], total)
        most["user"] = max(most["user"], running[task.key])
        seen[task.id] = task.fence
        if total == 4:
            ev["four"].set()
        try:
            await ev["go"].wait()
            await asyncio.sleep(0.01)
        finally:
            running[task.key] -= 1

    # Made on the loop (Python 3.9 binds an Event to a loop when it is made).
    ev: Dict[str, asyncio.Event] = {}

    async def main() -> Dict[str, Any]:
        four, go = ev["four"], ev["go"] = asyncio.Event(), asyncio.Event()
        worker = q.worker(handle, ttl=2, exit_when_idle=True)  # slots: 4 by default
        run = asyncio.create_task(worker.run())
        await wait_for(four, "4 tasks running at once")
        status = await q.status()
        go.set()
        await asyncio.wait_for(run, 30)
        assert worker.problems == []
        return status

    full = asyncio.run(main())
    assert most == {"all": 4, "user": 1}
    assert (full["running"], full["slots"]) == (4, 4)
    assert sum(full["pending"].values()) == 8
    assert len(full["leases"]) == 4
    assert len({lease["key"] for lease in full["leases"]}) == 4, full["leases"]
    assert all(lease["fence"] == seen[lease["task"]] for lease in full["leases"])
    view = queue.capacity(full)
    assert view["slots"] == {"max": 4, "used": 4, "available": 0}
    assert sorted(view["by_user"].values()) == [1, 1, 1, 1]
    assert set(view["by_user"]) <= set(names)
    assert sum(view["by_project"].values()) == 4
    assert view["pending"]["total"] == 8
    done = q.status_sync()
    assert (done["succeeded"], done["running"], done["workers"]) == (12, 0, [])
    assert sorted(seen) == sorted(ids)


def test_priorities_order(queue_url: str, tmp_path: Path) -> None:
    """With one slot: the best priority first across users, then the user served least
    recently; inside a user's line, priority then arrival."""
    q = open_queue(queue_url, tmp_path)
    alice, bob, carol = users(3)

    async def main() -> List[int]:
        a_low = await q.add(alice, "a1", priority="low")
        b_normal = await q.add(bob, "b1")
        c_high = await q.add(carol, "c1", priority="high")
        a_high = await q.add(alice, "a2", priority="HIGH")
        order: List[int] = []

        async def handle(task: queue.Task) -> None:
            order.append(task.id)

        await q.worker(handle, slots=1, ttl=2, exit_when_idle=True).run()
        assert order == [c_high, a_high, b_normal, a_low]
        return order

    order = asyncio.run(main())
    assert [q.get_sync(i)["priority"] for i in order] == ["high", "high", "normal", "low"]
    with pytest.raises(InvalidOption) as bad:
        q.add_sync(alice, "x", priority="urgent")
    assert bad.value.option == "priority"


def test_status_json_is_the_commands(queue_url: str, tmp_path: Path) -> None:
    """``status()`` is what ``leasehold queue status --json`` prints for the same database:
    pending by priority, by group, by key; then after a worker ran the tasks."""
    q = open_queue(queue_url, tmp_path)
    alice, bob = users(2)
    q.add_sync(alice, "1", priority="high", group="alice_project")
    q.add_sync(alice, "2", group="alice_project")
    cancelled = q.add_sync(bob, "3", priority="low", group="bob_project")
    q.add_sync(bob, "4", group="bob_project")
    assert q.cancel_sync(cancelled) == ("cancelled", None)
    mine = q.status_sync()
    assert mine == cli_status(queue_url)
    assert mine["pending"] == {"high": 1, "normal": 2, "low": 0}
    assert mine["cancelled"] == 1
    assert {g["name"]: g["pending"] for g in mine["groups"]} == {"alice_project": 2, "bob_project": 1}
    assert {k["name"]: k["pending"] for k in mine["keys"]} == {alice: 2, bob: 1}

    async def handle(task: queue.Task) -> None:
        pass

    async def main() -> Dict[str, Any]:
        await q.worker(handle, ttl=2, exit_when_idle=True).run()
        return await q.status()

    after = asyncio.run(main())
    assert after == cli_status(queue_url)
    assert (after["succeeded"], after["cancelled"], after["running"]) == (3, 1, 0)


def test_cancel(queue_url: str, tmp_path: Path) -> None:
    """A pending task cancelled never runs; a running one is asked to stop through its worker,
    which cancels its handler; an unknown id is NotFound."""
    q = open_queue(queue_url, tmp_path)
    alice, bob = users(2)
    pending = q.add_sync(alice, "never")
    assert q.cancel_sync(pending) == ("cancelled", None)
    assert q.cancel_sync(pending) == ("already-ended", "cancelled")
    assert q.get_sync(pending)["state"] == "cancelled"
    for bad in (pending + 10_000, -1, 2**64):
        with pytest.raises(NotFound):
            q.cancel_sync(bad)
    with pytest.raises(NotFound):
        q.get_sync(pending + 10_000)
    with pytest.raises(InvalidKey):
        q.add_sync("", "no key")

    async def main() -> None:
        started = asyncio.Event()
        heard: Dict[str, Any] = {}

        async def handle(task: queue.Task) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                heard["reason"] = task.stop_reason
                raise

        running = await q.add(bob, "forever")
        worker = q.worker(handle, ttl=2, exit_when_idle=True)
        run = asyncio.create_task(worker.run())
        await wait_for(started, "the task's start")
        assert await q.cancel(running) == queue.CancelResult("requested")
        await asyncio.wait_for(run, 10)
        assert heard == {"reason": "cancelled"}
        task = await q.get(running)
        assert (task["state"], task["detail"]) == ("cancelled", "cancelled")
        assert await q.cancel(running) == ("already-ended", "cancelled")

    asyncio.run(main())


def test_worker_runs_tasks_with_rising_fences(queue_url: str, tmp_path: Path) -> None:
    """A user's tasks run one after another, each under a new lease whose fence is above the
    last; the fence is the one recorded; a handler that raises fails its task."""
    q = open_queue(queue_url, tmp_path)
    (alice,) = users(1)
    ids = [q.add_sync(alice, {"n": n}) for n in range(3)]
    boom = q.add_sync(alice, {"n": 3})
    fences: List[int] = []
    payloads: List[Any] = []

    async def handle(task: queue.Task) -> None:
        assert task.deadline is None and task.stop_reason is None
        assert time.monotonic() < task.stop_by < task.valid_until
        assert task.record["id"] == task.id and task.worker == task.record["worker"]
        if task.id == boom:
            raise ValueError("no such file")
        fences.append(task.fence)
        payloads.append(task.json())

    asyncio.run(q.worker(handle, ttl=2, exit_when_idle=True).run())
    assert payloads == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert fences == sorted(set(fences)), fences
    assert [q.get_sync(i)["fence"] for i in ids] == fences
    failed = q.get_sync(boom)
    assert (failed["state"], failed["detail"]) == ("failed", "ValueError: no such file")
    assert failed["fence"] > fences[-1]


def test_handler_is_cancelled_at_the_stop_by_deadline(queue_url: str, tmp_path: Path) -> None:
    """Renewals of the key's lease fail: the handler is cancelled at the lease's stop-by
    deadline, before its valid_until; the task fails for the lost lease."""
    q = open_queue(queue_url, tmp_path, file_locks=True)
    (alice,) = users(1)
    task_id = q.add_sync(alice, "forever")

    async def main() -> Dict[str, Any]:
        started, cancelled = asyncio.Event(), asyncio.Event()
        heard: Dict[str, Any] = {}

        async def handle(task: queue.Task) -> None:
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                heard.update(at=time.monotonic(), reason=task.stop_reason, deadline=task.deadline,
                             stop_by=task.stop_by, valid_until=task.valid_until)
                cancelled.set()
                raise

        worker = q.worker(handle, ttl=1.5, exit_when_idle=True)
        run = asyncio.create_task(worker.run())
        await wait_for(started, "the task's start")
        blocker = Blocker(tmp_path / "locks", alice)
        try:
            await blocker.hold()
            await wait_for(cancelled, "the handler's cancellation", 5)
        finally:
            await blocker.release()
        await asyncio.wait_for(run, 10)
        assert worker.abandoned == []
        return heard

    heard = asyncio.run(main())
    assert heard["reason"].startswith("the key's lease was lost"), heard
    assert heard["stop_by"] <= heard["at"] < heard["valid_until"], heard
    assert heard["deadline"] == pytest.approx(heard["valid_until"], abs=0.01)
    task = q.get_sync(task_id)
    assert task["state"] == "failed" and task["detail"].startswith("the key's lease was lost"), task


def test_handler_ignoring_cancellation_is_abandoned_at_valid_until(
    queue_url: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A handler that swallows its cancellation is abandoned at the lease's valid_until: the
    worker says so (logged, ``problems``, ``abandoned``), records the task failed and goes on
    with the next task."""
    q = open_queue(queue_url, tmp_path, file_locks=True)
    alice, bob = users(2)
    stubborn = q.add_sync(alice, "stubborn")
    caplog.set_level("WARNING", logger="leasehold.queue")

    async def main() -> Dict[str, Any]:
        started, told, abandoned, let_go = (asyncio.Event() for _ in range(4))
        heard: Dict[str, Any] = {}
        later: List[int] = []

        async def handle(task: queue.Task) -> None:
            if task.key != alice:
                later.append(task.id)
                return
            started.set()
            while not let_go.is_set():
                try:
                    await let_go.wait()
                except asyncio.CancelledError:
                    heard.setdefault("told", time.monotonic())
                    heard["valid_until"] = task.valid_until
                    told.set()

        def problem(line: str) -> None:
            if "dropped" in line:
                heard["abandoned"] = time.monotonic()
                abandoned.set()

        worker = q.worker(handle, ttl=1.5, exit_when_idle=True, on_problem=problem)
        run = asyncio.create_task(worker.run())
        await wait_for(started, "the task's start")
        blocker = Blocker(tmp_path / "locks", alice)
        try:
            await blocker.hold()
            await wait_for(told, "the handler's cancellation", 5)
            await wait_for(abandoned, "the handler's abandonment", 5)
            # The abandoned task's lease is released once the store answers again; meanwhile
            # the worker goes on with other keys.
            next_task = await q.add(bob, "next")
        finally:
            await blocker.release()
        await asyncio.wait_for(run, 10)
        assert later == [next_task], "the worker went on"
        assert worker.abandoned == [stubborn]
        assert any("still running when the key's lease could expire" in p for p in worker.problems), worker.problems
        let_go.set()  # the abandoned handler ends when asyncio.run cancels what is left
        return heard

    heard = asyncio.run(main())
    assert heard["told"] < heard["valid_until"] <= heard["abandoned"] + 0.01, heard
    task = q.get_sync(stubborn)
    assert task["state"] == "failed" and task["detail"].startswith("the key's lease was lost"), task
    logged = [r.getMessage() for r in caplog.records if r.name == "leasehold.queue"]
    assert any(f"task {stubborn}" in m and "abandoned" in m for m in logged), logged


def test_worker_stop_and_cancelled_run_stop_the_handlers(queue_url: str, tmp_path: Path) -> None:
    """``stop()`` cancels the running handlers (the task is recorded cancelled) and ``run()``
    returns; cancelling ``run()`` itself stops the worker the same way; a worker runs once."""
    q = open_queue(queue_url, tmp_path)
    (alice,) = users(1)
    name = f"worker-{alice}"

    async def main() -> List[int]:
        started = asyncio.Event()
        heard: Dict[str, Any] = {}

        async def handle(task: queue.Task) -> None:
            heard["worker"] = task.worker
            started.set()
            try:
                await asyncio.Event().wait()
            except asyncio.CancelledError:
                heard["reason"] = task.stop_reason
                raise

        first = await q.add(alice, "forever")
        worker = q.worker(handle, ttl=2, name=name)
        assert worker.name == name
        run = asyncio.create_task(worker.run())
        await wait_for(started, "the first task's start")
        assert [w["id"] for w in (await q.status())["workers"]] == [name]
        worker.stop()
        await asyncio.wait_for(run, 10)
        assert heard == {"worker": name, "reason": "the worker shuts down"}
        with pytest.raises(InvalidOption):
            await worker.run()

        second = await q.add(alice, "forever again")
        started.clear()
        heard.clear()
        other = q.worker(handle, ttl=2)
        run = asyncio.create_task(other.run())
        await wait_for(started, "the second task's start")
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        assert other.is_stopping and heard["reason"] == "the worker shuts down"
        assert (await q.status())["workers"] == []
        return [first, second]

    for task_id in asyncio.run(main()):
        task = q.get_sync(task_id)
        assert (task["state"], task["detail"]) == ("cancelled", "stopped: the worker was shutting down")


def test_bad_input_is_a_typed_error(tmp_path: Path) -> None:
    """Bad options are InvalidOption naming the option (never a panic), a bad key InvalidKey, a
    bad id NotFound or TypeError."""
    q = queue.connect(f"sqlite://{tmp_path / 'queue.db'}", locks=f"file://{tmp_path / 'locks'}")
    bad_adds = [
        ("priority", dict(priority="urgent")),
        ("policy", dict(policy="twice")),
        ("max_attempts", dict(policy="at-least-once", max_attempts=0)),
        ("max_attempts", dict(policy="at-least-once", max_attempts=-1)),
        ("timeout", dict(timeout=0)),
        ("timeout", dict(timeout=-1)),
        ("timeout", dict(timeout=float("nan"))),
        ("timeout", dict(timeout=float("inf"))),
        ("timeout", dict(timeout=1e300)),
        ("group", dict(group="")),
    ]
    for option, kwargs in bad_adds:
        with pytest.raises(InvalidOption) as e:
            q.add_sync("alice", "x", **kwargs)
        assert e.value.option == option, (kwargs, e.value)
    for key in ("", "x" * 10_000, "a\0b"):
        with pytest.raises(InvalidKey):
            q.add_sync(key, "x")
    with pytest.raises(TypeError):
        q.cancel_sync("1")  # type: ignore[arg-type]

    async def handle(task: queue.Task) -> None:
        pass

    for option, kwargs in [("slots", dict(slots=0)), ("slots", dict(slots=-1)),
                           ("group_limit", dict(group_limit=2**40)), ("ttl", dict(ttl=1e300)),
                           ("stop_grace", dict(stop_grace=-1)), ("name", dict(name=" "))]:
        with pytest.raises(InvalidOption) as e:
            q.worker(handle, **kwargs)
        assert e.value.option == option, (kwargs, e.value)
    with pytest.raises(InvalidOption) as e:
        asyncio.run(q.worker(handle, ttl=0.001).run())
    assert e.value.option == "ttl"
    assert q.status_sync()["pending"] == {"high": 0, "normal": 0, "low": 0}


def test_default_lease_store_is_the_commands(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without ``locks``, workers take their leases where ``leasehold queue work`` does."""
    monkeypatch.delenv("LEASEHOLD_STORE", raising=False)
    monkeypatch.delenv("LEASEHOLD_QUEUE", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    pg = "postgres://u@db:5432/jobs"
    assert queue.default_store_url(pg) == pg
    assert queue.default_store_url("sqlite:///q.db") == (tmp_path / "leasehold" / "locks").as_uri() + "/"
    assert queue.default_queue_url() == f"sqlite://{tmp_path / 'leasehold' / 'queue.db'}"
    monkeypatch.setenv("LEASEHOLD_STORE", "redis://r:6379")
    assert queue.default_store_url(pg) == "redis://r:6379"
