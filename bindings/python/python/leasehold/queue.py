"""The per-key serialised task queue: one running task per key, global capacity slots, fair
choice across keys, each task run under its key's lease with a fencing token.

The same queue as ``leasehold queue …`` (the command and this module share the database):

>>> from leasehold import queue
>>> q = queue.connect("sqlite:///tmp/leasehold-doctest-queue.db")
>>> task_id = q.add_sync("alice", {"prompt": "fix the bug"}, priority="high")
>>> q.status_sync()["pending"]["high"] >= 1
True

A worker runs an async handler per task, on the event loop that awaits :meth:`Worker.run`::

    async def handle(task: queue.Task) -> None:
        await write(task.json(), fence=task.fence)

    await q.worker(handle, slots=4).run()

A task is handed out only while fewer than ``slots`` tasks run in the whole queue, and never while
another task of its key runs (per-user serialisation when the key is a user). Among the keys that
may run, the best priority wins, then the key served least recently.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import weakref
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Dict, List, NamedTuple, Optional, TypedDict, Union, cast

from . import _native
from ._locks import Locks
from ._locks import connect as _connect_locks
from .errors import NotFound

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = [
    "connect",
    "capacity",
    "default_queue_url",
    "default_store_url",
    "Queue",
    "Worker",
    "WorkerKeywords",
    "TaskKeywords",
    "Task",
    "CancelResult",
]

logger = logging.getLogger("leasehold.queue")

#: A task's handler: called with the :class:`Task`, awaited to its end.
Handler = Callable[["Task"], Awaitable[Any]]

_MAX_ID = 2**64 - 1


def default_queue_url() -> str:
    """The queue the command uses without ``--queue``: ``LEASEHOLD_QUEUE``, else
    ``sqlite://<state dir>/leasehold/queue.db`` (the library's default, as the command finds it)."""
    return _native.default_queue_url()


def default_store_url(queue_url: str) -> str:
    """The lease store a worker of ``queue_url`` uses without ``locks``, as ``leasehold queue
    work`` picks it: ``LEASEHOLD_STORE``; else, for a PostgreSQL queue, the same database; else the
    command's default file store (``<state dir>/leasehold/locks``)."""
    return _native.worker_store_url(queue_url)


class TaskKeywords(TypedDict, total=False):
    """The keywords of :meth:`Queue.add` and :meth:`Queue.add_sync` (see :meth:`Queue.add`)."""

    priority: str
    group: Optional[str]
    timeout: Optional[float]
    policy: str
    max_attempts: int


class WorkerKeywords(TypedDict, total=False):
    """The options of :class:`Worker` (see there; each left out keeps the library's default)."""

    slots: Optional[int]
    ttl: Optional[float]
    group_limit: Optional[int]
    lease_wait: Optional[float]
    aging: Optional[float]
    drain_timeout: Optional[float]
    stop_grace: Optional[float]
    cleanup_after: Optional[float]
    exit_when_idle: bool


def connect(url: Optional[str] = None, *, locks: Union[Locks, str, None] = None) -> "Queue":
    """Opens the queue at ``url``: ``sqlite:///path/queue.db`` (one host) or ``postgres://…``
    (many hosts). Without ``url``, the command's default (:func:`default_queue_url`).

    ``locks`` is where workers take the key leases: a :class:`leasehold.Locks`, a store URL, or
    ``None`` for what ``leasehold queue work`` uses (:func:`default_store_url`: the queue's own
    PostgreSQL database, else the default file store). It is opened when the first worker is made.

    Blocks while the database is opened (its tables created if missing). Raises
    :class:`~leasehold.InvalidUrl` for a URL it cannot use, :class:`~leasehold.Unavailable` for a
    server that does not answer.
    """
    url = url if url is not None else default_queue_url()
    return Queue(_native.open_queue(url), url, locks)


def _task_id(task_id: int) -> int:
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"a task id is an int, not {type(task_id).__name__}")
    if not 0 <= task_id <= _MAX_ID:
        raise NotFound(f"task {task_id} not found")
    return task_id


def _payload(payload: Any) -> str:
    return payload if isinstance(payload, str) else json.dumps(payload)


class CancelResult(NamedTuple):
    """What :meth:`Queue.cancel` did."""

    #: ``"cancelled"`` (it was pending: it never runs), ``"requested"`` (it runs: its worker was
    #: asked to stop it), or ``"already-ended"``.
    outcome: str
    #: For ``"already-ended"``, the state it ended in: ``succeeded``, ``failed`` or ``cancelled``.
    state: Optional[str] = None


def capacity(status: Dict[str, Any]) -> Dict[str, Any]:
    """The capacity view of a :meth:`Queue.status` dict, in the shape of a per-user queue
    controller's report: ``{"slots": {"max", "used", "available"}, "by_user": {key: running},
    "by_project": {group: running}, "pending": {"high", "normal", "low", "total"}}``.

    Keys are taken as users and groups as projects. ``slots.max`` is the largest slot count among
    live workers (0 without workers); ``by_user`` covers the keys the status lists (the busiest
    100).
    """
    used = status["running"]
    most = status["slots"]
    pending = dict(status["pending"])
    pending["total"] = pending["high"] + pending["normal"] + pending["low"]
    return {
        "slots": {"max": most, "used": used, "available": max(most - used, 0)},
        "by_user": {k["name"]: k["running"] for k in status["keys"] if k["running"]},
        "by_project": {g["name"]: g["running"] for g in status["groups"] if g["running"]},
        "pending": pending,
    }


class Queue:
    """A task queue, made by :func:`connect`. Every call is one transaction; several processes
    (and hosts, on PostgreSQL) share a queue safely."""

    def __init__(self, native: _native.Queue, url: str, locks: Union[Locks, str, None]) -> None:
        self._native = native
        self._url = url
        self._locks_given = locks
        self._locks: Optional[Locks] = locks if isinstance(locks, Locks) else None

    def locks(self) -> Locks:
        """The lease store this queue's workers take the key leases from (opened on first use)."""
        if self._locks is None:
            given = self._locks_given
            url = given if isinstance(given, str) else default_store_url(self._url)
            self._locks = _connect_locks(url)
        return self._locks

    async def add(self, key: str, payload: Any = "", **options: Unpack[TaskKeywords]) -> int:
        """Adds a task for ``key`` (the unit that runs one task at a time, e.g. a user); returns
        its id.

        - ``payload``: a ``str`` is stored as is, anything else as its JSON text
          (:meth:`Task.json` reads it back).
        - ``priority``: ``"high"``, ``"normal"`` or ``"low"``; waiting tasks gain a level per
          worker ``aging`` period.
        - ``group``: an accounting unit (e.g. a project): ``by_project`` in :func:`capacity`,
          and the workers' ``group_limit``.
        - ``timeout``: seconds the task may run before its worker cancels it.
        - ``policy``: if its worker dies mid-task, ``"at-most-once"`` fails it,
          ``"at-least-once"`` runs it again, up to ``max_attempts`` attempts in all.

        Raises :class:`~leasehold.InvalidKey` or :class:`~leasehold.InvalidOption` for bad input.
        """
        got = await self._native.add(_native.NewTask(key, _payload(payload), **options))
        return got[0]

    def add_sync(self, key: str, payload: Any = "", **options: Unpack[TaskKeywords]) -> int:
        """The blocking form of :meth:`add`."""
        return self._native.add_sync(_native.NewTask(key, _payload(payload), **options))[0]

    async def status(self) -> Dict[str, Any]:
        """The queue at a glance, exactly as ``leasehold queue status --json`` prints it:
        ``pending`` (by priority: ``high``, ``normal``, ``low``), ``running`` (slots used),
        ``slots`` (capacity of the live workers), ``succeeded``, ``failed``, ``cancelled``,
        ``corrupt``, ``groups`` and ``keys`` (``{"name", "pending", "running"}`` each; keys
        busiest first), ``keys_total``, ``leases`` (the running keys' holder, task, fence and
        times) and ``workers``. :func:`capacity` turns it into the slots / by_user view."""
        return cast(Dict[str, Any], json.loads(await self._native.status()))

    def status_sync(self) -> Dict[str, Any]:
        """The blocking form of :meth:`status`."""
        return cast(Dict[str, Any], json.loads(self._native.status_sync()))

    async def cancel(self, task_id: int) -> CancelResult:
        """Cancels a task: a pending one at once; a running one through its worker, which
        cancels its handler. Raises :class:`~leasehold.NotFound` for an unknown id."""
        return CancelResult(*await self._native.cancel(_task_id(task_id)))

    def cancel_sync(self, task_id: int) -> CancelResult:
        """The blocking form of :meth:`cancel`."""
        return CancelResult(*self._native.cancel_sync(_task_id(task_id)))

    async def get(self, task_id: int) -> Dict[str, Any]:
        """One task as stored: ``id``, ``key``, ``group``, ``priority``, ``effective``,
        ``payload``, ``state``, ``policy``, ``attempts``, ``fence``, ``worker``, ``detail`` (why it
        ended so) and times in Unix ms. Raises :class:`~leasehold.NotFound` for an unknown id."""
        return cast(Dict[str, Any], json.loads(await self._native.get(_task_id(task_id))))

    def get_sync(self, task_id: int) -> Dict[str, Any]:
        """The blocking form of :meth:`get`."""
        return cast(Dict[str, Any], json.loads(self._native.get_sync(_task_id(task_id))))

    async def tasks(self, *, all: bool = False, limit: int = 1000) -> List[Dict[str, Any]]:
        """Pending and running tasks in id order (ended ones too with ``all``), at most
        ``limit``, each as :meth:`get` gives it (an unreadable record as ``{"id", "corrupt"}``)."""
        return cast(List[Dict[str, Any]], json.loads(await self._native.list(all, limit)))

    def tasks_sync(self, *, all: bool = False, limit: int = 1000) -> List[Dict[str, Any]]:
        """The blocking form of :meth:`tasks`."""
        return cast(List[Dict[str, Any]], json.loads(self._native.list_sync(all, limit)))

    async def cleanup(self, older_than: float) -> int:
        """Deletes the tasks that ended at least ``older_than`` seconds ago; returns how many."""
        return await self._native.cleanup(older_than)

    def cleanup_sync(self, older_than: float) -> int:
        """The blocking form of :meth:`cleanup`."""
        return self._native.cleanup_sync(older_than)

    def worker(
        self,
        handler: Handler,
        *,
        name: Optional[str] = None,
        on_problem: Optional[Callable[[str], Any]] = None,
        **options: Unpack[WorkerKeywords],
    ) -> "Worker":
        """A :class:`Worker` of this queue running ``handler``; ``options`` as
        :class:`Worker` takes them."""
        return Worker(self, handler, name=name, on_problem=on_problem, **options)

    def __repr__(self) -> str:
        return f"Queue({self._url.split('://', 1)[0]}://…)"


class Task:
    """A task a :class:`Worker` runs, as its handler gets it: the task, the fence of its key's
    lease, the lease's times, and why it must stop once it must."""

    def __init__(self, native: _native.QueueTask) -> None:
        self._native = native

    @property
    def id(self) -> int:
        """The task id."""
        return self._native.id

    @property
    def key(self) -> str:
        """The task's key (one running task per key)."""
        return self._native.key

    @property
    def group(self) -> Optional[str]:
        """The task's group, if any."""
        return self._native.group

    @property
    def priority(self) -> str:
        """The priority it was added with: ``high``, ``normal`` or ``low``."""
        return self._native.priority

    @property
    def effective_priority(self) -> str:
        """Its priority when claimed, raised by aging."""
        return self._native.effective_priority

    @property
    def payload(self) -> str:
        """The payload text."""
        return self._native.payload

    def json(self) -> Any:
        """The payload parsed as JSON (what :meth:`Queue.add` stored for a non-``str`` payload)."""
        return json.loads(self._native.payload)

    @property
    def attempts(self) -> int:
        """Attempts started so far, this one included."""
        return self._native.attempts

    @property
    def timeout(self) -> Optional[float]:
        """The task's timeout in seconds, if it has one."""
        return self._native.timeout

    @property
    def fence(self) -> int:
        """The fence of the key's lease held for this run: strictly greater than any earlier
        run's of the key. Pass it with every write, so a late writer can be refused."""
        return self._native.fence

    @property
    def worker(self) -> str:
        """The worker's name: the holder of the key's lease."""
        return self._native.worker

    @property
    def record(self) -> Dict[str, Any]:
        """The task as stored when it was claimed (see :meth:`Queue.get`)."""
        return cast(Dict[str, Any], json.loads(self._native.record))

    @property
    def valid_until(self) -> float:
        """Up to when the key's lease is surely this worker's, on ``time.monotonic()``'s scale;
        moved by each renewal. The handler is abandoned if it still runs then, once told to
        stop."""
        return self._native.valid_until

    @property
    def stop_by(self) -> float:
        """When the handler is cancelled if the lease's renewals keep failing (``valid_until``
        less the loss grace), on ``time.monotonic()``'s scale."""
        return self._native.stop_by

    @property
    def deadline(self) -> Optional[float]:
        """By when the task must be gone once the key's lease must be given up, on
        ``time.monotonic()``'s scale; ``None`` while the lease is healthy."""
        return self._native.deadline

    @property
    def stop_reason(self) -> Optional[str]:
        """Why the task must stop, once it was told to (then its handler is cancelled):
        ``"cancelled"``, ``"timed out"``, ``"the worker shuts down"`` or ``"the key's lease was
        lost: …"``."""
        return self._native.stop_reason

    async def stopped(self) -> str:
        """Completes, with why, when the task must stop (its handler is cancelled then too)."""
        return await self._native.stopped()

    def __repr__(self) -> str:
        return f"Task(id={self.id}, key={self.key!r}, fence={self.fence})"


def _hook(worker: "Worker", method: str) -> Callable[..., None]:
    # The native worker holds its hooks: through a weak reference, so that it keeps no cycle.
    ref = weakref.ref(worker)

    def call(*args: Any) -> None:
        me = ref()
        if me is not None:
            getattr(me, method)(*args)

    return call


class Worker:
    """Claims the queue's tasks and runs ``handler(task)`` for each, on the event loop that
    awaits :meth:`run`, under the task key's lease (see :meth:`Queue.worker`).

    - ``slots`` (default 4): the global capacity: no task is claimed while this many run in the
      whole queue, and this worker runs at most this many at once.
    - ``ttl`` (default 30 s): the TTL of the key leases and of the worker's claims, both renewed
      every ``ttl / 3``; a dead worker's tasks are recovered (by ``policy``) a TTL after it died.
    - ``group_limit``: at most this many running tasks per group. ``lease_wait`` (default
      ``2 × ttl``): how long a claimed task waits for its key's lease before it goes back.
      ``aging`` (default 60 s): a waiting task gains a priority level per period.
      ``cleanup_after``: delete tasks that ended this long ago (default: never).
    - ``drain_timeout`` (default 30 s): after :meth:`drain`, how long running tasks may finish
      before they are cancelled. ``stop_grace`` (default 10 s): how long a cancelled handler
      may take to end before it is abandoned.
    - ``exit_when_idle``: :meth:`run` returns once the whole queue has nothing pending or
      running.
    - ``name``: the worker's name in the queue and holder of its leases (default: the lease
      store's holder id). Two live workers must not share one.
    - ``on_problem(line)``: called on the loop with each problem the worker goes on from (also
      logged at WARNING on the ``leasehold.queue`` logger and kept in :attr:`problems`).

    **Stopping.** The handler's task is cancelled (``asyncio.CancelledError``, with
    :attr:`Task.stop_reason` set) when the task is cancelled (:meth:`Queue.cancel`), runs past
    its timeout, the worker stops, or the key's lease must be given up: at the lease's stop-by
    deadline when renewals keep failing, at once when the store says the lease is gone. A
    handler that was told to stop ends as the stop says (``cancelled``; ``failed`` for a lost
    lease), however it ends. One that ignores the cancellation is **abandoned** at the lease's
    ``valid_until`` (or ``stop_grace`` after a stop for another reason): the worker logs it,
    records the task's end, releases the key and goes on; the coroutine is left to the loop and
    its id is added to :attr:`abandoned`.

    Otherwise a handler that returns succeeds, and one that raises fails the task (the exception
    as its ``detail``).
    """

    def __init__(
        self,
        queue: Queue,
        handler: Handler,
        *,
        name: Optional[str] = None,
        on_problem: Optional[Callable[[str], Any]] = None,
        **options: Unpack[WorkerKeywords],
    ) -> None:
        if not callable(handler):
            raise TypeError("handler must be callable: an async function of one Task")
        native_options = _native.WorkerOptions(**options)
        self._queue = queue
        self._handler = handler
        self._on_problem = on_problem
        self._loop: Optional[asyncio.AbstractEventLoop] = None
        self._tasks: Dict[int, "asyncio.Task[None]"] = {}
        self._left: Dict[int, "asyncio.Task[None]"] = {}
        #: Each problem the worker met and went on from, one line each.
        self.problems: List[str] = []
        #: The ids of the tasks whose handler was abandoned (still running when it had to be gone).
        self.abandoned: List[int] = []
        self._native = _native.Worker(
            queue._native,
            queue.locks()._native,
            _hook(self, "_start"),
            _hook(self, "_cancel"),
            _hook(self, "_abandon"),
            _hook(self, "_report"),
            native_options,
            name=name,
        )

    @property
    def name(self) -> str:
        """The worker's name in the queue: the holder of its key leases."""
        return self._native.name

    async def run(self) -> None:
        """Runs the worker: registers it, claims and runs tasks until :meth:`drain` or
        :meth:`stop` (or, with ``exit_when_idle``, until the queue is idle) and none runs any
        more, then deregisters it. A worker runs once.

        Cancelling ``run`` stops the worker (:meth:`stop`) and waits for its running tasks to
        end or be abandoned before the cancellation goes on. Raises
        :class:`~leasehold.InvalidOption` for options that cannot work, or when another live
        worker runs under the same name.
        """
        self._loop = asyncio.get_running_loop()
        running = self._native.run()
        try:
            await asyncio.shield(running)
        except asyncio.CancelledError:
            self._native.stop()
            try:
                await running
            except Exception:  # the cancellation is what the caller hears of
                logger.debug("the worker ended with an error while cancelled", exc_info=True)
            raise

    def drain(self) -> None:
        """Claims nothing more; running tasks may finish for up to ``drain_timeout``, then are
        cancelled. :meth:`run` returns once none runs. Thread-safe, idempotent."""
        self._native.drain()

    def stop(self) -> None:
        """Drains, and cancels the running tasks now. Thread-safe, idempotent."""
        self._native.stop()

    @property
    def is_stopping(self) -> bool:
        """Whether :meth:`drain` or :meth:`stop` was called."""
        return self._native.is_stopping

    # The hooks, called by the native worker from its threads (with the GIL).

    def _post(self, callback: Callable[..., Any], *args: Any) -> None:
        loop = self._loop
        if loop is None:
            raise RuntimeError("the worker is not running")
        loop.call_soon_threadsafe(callback, *args)

    def _start(self, native: _native.QueueTask) -> None:
        self._post(self._spawn, native)

    def _cancel(self, task_id: int, reason: str) -> None:
        self._post(self._cancel_on_loop, task_id, reason)

    def _abandon(self, task_id: int, reason: str) -> None:
        try:
            self._post(self._abandon_on_loop, task_id, reason)
        except RuntimeError:  # the loop is closed: nothing runs there any more
            self.abandoned.append(task_id)

    def _report(self, line: str) -> None:
        logger.warning("%s", line)
        self.problems.append(line)
        if self._on_problem is not None:
            try:
                self._post(self._on_problem, line)
            except RuntimeError:
                pass

    # On the loop.

    def _spawn(self, native: _native.QueueTask) -> None:
        assert self._loop is not None
        self._tasks[native.id] = self._loop.create_task(self._execute(native))

    def _cancel_on_loop(self, task_id: int, reason: str) -> None:
        task = self._tasks.get(task_id)
        if task is not None:
            task.cancel(reason)

    def _abandon_on_loop(self, task_id: int, reason: str) -> None:
        self.abandoned.append(task_id)
        task = self._tasks.pop(task_id, None)
        if task is not None and not task.done():
            logger.warning(
                "task %d: its handler did not end in time (%s); abandoned, left running on the loop",
                task_id, reason,
            )
            task.cancel(reason)
            self._left[task_id] = task

    async def _execute(self, native: _native.QueueTask) -> None:
        kind, detail = "succeeded", None
        try:
            got = self._handler(Task(native))
            if inspect.isawaitable(got):
                await got
        except asyncio.CancelledError:
            kind, detail = "cancelled", native.stop_reason or "its handler was cancelled"
        except Exception as e:
            kind, detail = "failed", f"{type(e).__name__}: {e}"
            logger.warning("task %d: its handler raised", native.id, exc_info=True)
        except BaseException as e:
            native._finish("failed", f"{type(e).__name__}: {e}")
            raise
        finally:
            self._tasks.pop(native.id, None)
        if not native._finish(kind, detail) and self._left.pop(native.id, None) is not None:
            logger.warning("task %d: its abandoned handler ended (%s)", native.id, kind)

    def __repr__(self) -> str:
        return f"Worker(name={self.name!r})"
