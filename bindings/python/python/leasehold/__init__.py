"""Distributed locks and leases with fencing tokens, over many stores.

The Python package of leasehold: the same Rust core as the ``leasehold`` command, in process.

>>> import leasehold
>>> locks = leasehold.connect("file:///tmp/leasehold-doctest")
>>> with locks.lock("nightly", ttl=30).acquire(wait=0) as lease:
...     lease.fence > 0
True

In asyncio code::

    async with locks.lock("user:alice", ttl=30, wait=10) as lease:
        await write(lease.fence)

Store calls run on the library's own threads with the GIL released (in asyncio code, open the
store with ``await connect_async(url)``). Linux only. Every store URL the command takes works
here (``file://``, ``redis://``, ``k8s://``, ``gs://``, ``s3://``, ``az://``, ``postgres://``,
``etcd://``, ``redlock://``, ``memory://``).
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import inspect
import json
import threading
import weakref
from typing import Any, Awaitable, Callable, Dict, Generator, Generic, List, Optional, Tuple, TypeVar, Union, cast

from . import _native
from . import errors
from .errors import *  # noqa: F403  (every exception class, listed in errors.__all__)
from .errors import LeaseholdError, LeaseLost

__version__: str = _native.__version__

__all__ = [
    "connect",
    "connect_async",
    "settle",
    "Locks",
    "Lock",
    "Acquiring",
    "Lease",
]
__all__ += errors.__all__

T = TypeVar("T")

#: ``on_release_requested(lease, waiter)``: someone waits for the lease (checkpoint and release).
ReleaseRequested = Callable[["Lease", str], Union[None, Awaitable[None]]]
#: ``on_renewal_error(lease, error)``: the lease is lost (``error`` is a :class:`LeaseLost`).
RenewalError = Callable[["Lease", LeaseLost], Union[None, Awaitable[None]]]

# How often a handler thread of a lease taken without an event loop checks that the lease is
# still held (it waits in the library with the GIL released meanwhile).
_HANDLER_POLL = 0.25

_UNSET: Any = object()


def connect(url: str, *, holder: Optional[str] = None, local_layer: bool = True) -> "Locks":
    """Opens the store at ``url`` (any store URL the ``leasehold`` command takes).

    ``holder`` is this client's identity in the records (default: host, process id and a random
    part). ``local_layer`` (default on) serves tasks of this process that want the same key from
    an in-process queue first, so they do not race each other at the store.

    Blocks while the store is opened (a connection, a read of credentials), with the GIL released;
    in asyncio code, use :func:`connect_async`, which lets the event loop go on meanwhile.
    Raises :class:`InvalidUrl` for a URL it cannot use, :class:`Unavailable` for a store that
    does not answer (retryable), and a :class:`StoreError` that is not retryable when the store
    refuses this client (no credentials).
    """
    return Locks(_native.connect(url, holder=holder, local_layer=local_layer))


async def connect_async(url: str, *, holder: Optional[str] = None, local_layer: bool = True) -> "Locks":
    """:func:`connect` for asyncio code: the store is opened on the library's threads while the
    event loop goes on. Same arguments and errors."""
    return Locks(await _native.connect_async(url, holder=holder, local_layer=local_layer))


def settle(timeout: float = 2.0) -> int:
    """Waits up to ``timeout`` seconds for background releases (of leases dropped without
    ``release``) to finish; returns how many were left. Runs at interpreter exit by itself."""
    return _native.settle(timeout)


def _settle_at_exit() -> None:
    try:
        _native.settle(2.0)
    except LeaseholdError:
        pass  # a forked child that never used leasehold has nothing to settle


atexit.register(_settle_at_exit)


class Locks:
    """One client of one store, with one holder identity. Made by :func:`connect`."""

    def __init__(self, native: _native.Locks) -> None:
        self._native = native

    @property
    def holder(self) -> str:
        """This client's holder identity, as the records show it."""
        return self._native.holder

    @property
    def store(self) -> str:
        """The store, described without credentials."""
        return self._native.store

    def lock(
        self,
        key: str,
        *,
        ttl: Optional[float] = None,
        wait: Optional[float] = None,
        renew_every: Optional[float] = None,
        waiter_ttl: Optional[float] = None,
        register_waiter: bool = True,
        labels: Optional[Dict[str, str]] = None,
        on_release_requested: Optional[ReleaseRequested] = None,
        on_renewal_error: Optional[RenewalError] = None,
    ) -> "Lock":
        """The lock on ``key``, not taken yet: use it with ``async with``/``with``, or call
        :meth:`Lock.acquire` / :meth:`Lock.try_acquire`.

        - ``ttl``: seconds the lease lives without renewal (default 30); it renews itself every
          ``renew_every`` (default ``ttl / 3``) while held.
        - ``wait``: how long ``acquire`` waits for a held lease, in seconds; ``None`` (default)
          waits without limit, ``0`` not at all. Past it, :class:`Timeout` names the holder.
        - ``register_waiter``: while waiting, be registered in the store's line of waiters, so the
          holder's ``handoff_requested()`` fires and the released lease goes to the first in line.
        - ``labels``: text shown with the record (``leasehold inspect``).
        - ``on_release_requested(lease, waiter)``: called once when someone waits for the lease.
        - ``on_renewal_error(lease, error)``: called once if the lease is lost while held.

        Handlers may be plain functions or coroutine functions. For a lease taken in asyncio code
        they run on its event loop; for one taken without (``with`` / ``result()``), plain
        functions run on a thread of their own and a coroutine function's coroutine is run there
        with ``asyncio.run``.
        """
        return Lock(
            self,
            key,
            dict(
                ttl=ttl,
                wait=wait,
                renew_every=renew_every,
                waiter_ttl=waiter_ttl,
                register_waiter=register_waiter,
                labels=labels,
            ),
            on_release_requested,
            on_renewal_error,
        )

    async def inspect(self, key: str) -> Optional[Dict[str, Any]]:
        """The key's record as ``leasehold inspect --json`` shows it, or ``None`` when there is
        none."""
        text = await self._native.inspect(key)
        return None if text is None else json.loads(text)

    def inspect_sync(self, key: str) -> Optional[Dict[str, Any]]:
        """The blocking form of :meth:`inspect`."""
        text = self._native.inspect_blocking(key)
        return None if text is None else json.loads(text)

    async def force_release(self, key: str) -> Optional[Dict[str, Any]]:
        """Frees ``key`` whoever holds it, as ``leasehold release --force`` does: the record it
        removed, or ``None`` when the key was free. The holder's next renewal fails and its
        ``lost()`` fires (its handler ``on_renewal_error`` is called)."""
        text = await self._native.force_release(key)
        return None if text is None else json.loads(text)

    def force_release_sync(self, key: str) -> Optional[Dict[str, Any]]:
        """The blocking form of :meth:`force_release`."""
        text = self._native.force_release_blocking(key)
        return None if text is None else json.loads(text)

    def __repr__(self) -> str:
        return f"Locks(store={self.store!r}, holder={self.holder!r})"


#: The ``Lock`` blocks the current task (or thread, outside asyncio) is inside, innermost last:
#: each block's exit releases its own lease, whatever other tasks entered the same ``Lock``.
_ENTERED: "contextvars.ContextVar[Tuple[Acquiring[Any], ...]]" = contextvars.ContextVar(
    "leasehold_entered", default=()
)


class Lock:
    """A lock on one key with its options, made by :meth:`Locks.lock`. Cheap: make one per use.

    As a context manager (``async with`` or ``with``) it acquires with its options on entry and
    releases on exit. One ``Lock`` object may be shared by tasks and threads: each block takes a
    lease of its own and its exit releases that lease, never another task's.
    """

    def __init__(
        self,
        locks: Locks,
        key: str,
        options: Dict[str, Any],
        on_release_requested: Optional[ReleaseRequested],
        on_renewal_error: Optional[RenewalError],
    ) -> None:
        self._locks = locks
        self.key = key
        self._options = options
        self._handlers = (on_release_requested, on_renewal_error)
        self._has_handlers = on_release_requested is not None or on_renewal_error is not None
        self._try_options = {k: options[k] for k in ("ttl", "renew_every", "labels")}

    def acquire(self, wait: Optional[float] = _UNSET) -> "Acquiring[Lease]":
        """Takes the lease, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        The result is awaitable (``lease = await lock.acquire()``), a context manager in either
        form (``with lock.acquire(wait=0) as lease:`` blocks without an event loop), or
        ``lock.acquire().result()`` for a blocking call. Raises :class:`Timeout` when the wait
        limit passes. Cancelling an awaiting acquire (``asyncio.wait_for``, task cancel) leaves
        nothing behind: a grant in flight is released and the waiter registration withdrawn.
        """
        opts = self._options
        if wait is not _UNSET:
            opts = dict(opts, wait=wait)
        return Acquiring(self, False, opts)

    def try_acquire(self) -> "Acquiring[Optional[Lease]]":
        """Takes the lease if it is free: the :class:`Lease`, or ``None`` when it is held elsewhere.

        Awaitable, or ``.result()`` for the blocking form; as a context manager it gives ``None``
        when held elsewhere and releases on exit when it got the lease.
        """
        return Acquiring(self, True, self._try_options)

    def _enter(self, entered: "Acquiring[Any]") -> None:
        _ENTERED.set(_ENTERED.get() + (entered,))

    def _exit(self) -> "Acquiring[Any]":
        """This task's (or thread's) innermost block of this lock, taken off its stack."""
        stack = _ENTERED.get()
        for i in range(len(stack) - 1, -1, -1):
            if stack[i]._lock is self:
                _ENTERED.set(stack[:i] + stack[i + 1 :])
                return stack[i]
        raise RuntimeError(
            f"{self!r} exited in a task or thread that did not enter it: a lock's block must end "
            "in the task (or thread) that began it"
        )

    async def __aenter__(self) -> "Lease":
        entered = self.acquire()
        lease = await entered.__aenter__()
        self._enter(entered)
        return lease

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        await self._exit().__aexit__(et, ev, tb)

    def __enter__(self) -> "Lease":
        entered = self.acquire()
        lease = entered.__enter__()
        self._enter(entered)
        return lease

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        self._exit().__exit__(et, ev, tb)

    def __repr__(self) -> str:
        return f"Lock(key={self.key!r}, store={self._locks.store!r})"


class Acquiring(Generic[T]):
    """An acquisition not started yet: await it, use it as a context manager (``with`` or
    ``async with``), or call :meth:`result` to block for it. Nothing happens until one of these.
    """

    __slots__ = ("_lock", "_try", "_options", "_lease")

    def __init__(self, lock: Lock, try_only: bool, options: Dict[str, Any]) -> None:
        self._lock = lock
        self._try = try_only
        self._options = options
        self._lease: Optional[Lease] = None

    def _wrap(self, native: Optional[_native.Lease], loop: Optional[asyncio.AbstractEventLoop]) -> Any:
        if native is None:
            return None
        return Lease(native, self._lock._handlers, loop)

    async def _run(self) -> T:
        lock = self._lock
        native_locks = lock._locks._native
        cancel = _native.Cancel()
        if self._try:
            pending = native_locks.try_acquire(lock.key, cancel, **self._options)
        else:
            pending = native_locks.acquire(lock.key, cancel, **self._options)
        try:
            # An answer that was there at once cannot be cancelled: only a pending one is.
            native = await pending
        except asyncio.CancelledError:
            # Undo before the cancellation completes: a lease granted first is released, a
            # waiter registration withdrawn and a grant in flight released.
            late: Optional[_native.Lease] = None
            if isinstance(pending, asyncio.Future) and pending.done() and not pending.cancelled():
                # Answered, but cancelled before this task resumed to take the answer (a timer
                # that fired in the same turn of the loop): the lease is in the answer.
                if pending.exception() is None:
                    late = pending.result()
            else:
                cancel.cancel()
                late = await cancel.late()
            if late is not None:
                await late.release()
            raise
        return cast(T, self._wrap(native, asyncio.get_running_loop() if lock._has_handlers else None))

    def __await__(self) -> Generator[Any, None, T]:
        return self._run().__await__()

    def result(self) -> T:
        """Blocks for the acquisition (with the GIL released; Ctrl-C interrupts it and leaves
        nothing taken)."""
        lock = self._lock
        if self._try:
            native = lock._locks._native.try_acquire_blocking(lock.key, **self._options)
        else:
            native = lock._locks._native.acquire_blocking(lock.key, **self._options)
        return cast(T, self._wrap(native, None))

    def __enter__(self) -> T:
        got = self.result()
        self._lease = got  # type: ignore[assignment]
        return got

    def __exit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._lease is not None:
            self._lease._exit_sync(et is not None)

    async def __aenter__(self) -> T:
        got = await self._run()
        self._lease = got  # type: ignore[assignment]
        return got

    async def __aexit__(self, et: Any, ev: Any, tb: Any) -> None:
        if self._lease is not None:
            await self._lease._exit_async(et is not None)


class Lease:
    """A lease this process holds, renewed in the background until released.

    ``fence`` rises strictly with every lease of the key: pass it to what you write, so the
    resource can refuse a writer whose lease is older than one it has seen.
    """

    __slots__ = ("_native", "_loop", "_released", "_loss_seen", "_done", "_handles_loss", "_tasks", "__weakref__")

    def __init__(
        self,
        native: _native.Lease,
        handlers: "tuple[Optional[ReleaseRequested], Optional[RenewalError]]",
        loop: Optional[asyncio.AbstractEventLoop],
    ) -> None:
        self._native = native
        self._loop = loop
        self._released = False
        self._loss_seen = False
        self._done: Optional[threading.Event] = None
        on_release_requested, on_renewal_error = handlers
        self._handles_loss = on_renewal_error is not None
        self._tasks: List["asyncio.Task[None]"] = []
        if not self._handles_loss and on_release_requested is None:
            return
        if loop is None:
            self._done = threading.Event()
        # The watchers hold the lease weakly: a lease dropped without release() is released
        # (in the background) and stops renewing, handlers or not.
        if on_release_requested is not None:
            self._start("handoff_requested", lambda lease, waiter: on_release_requested(lease, waiter))
        if on_renewal_error is not None:
            self._start("lost", lambda lease, reason: on_renewal_error(lease, lease._lost_error(reason)))

    def _lost_error(self, reason: str) -> LeaseLost:
        return LeaseLost(f"lease on {self.key} lost: {reason}", key=self.key, reason=reason)

    def _start(self, which: str, call: Callable[["Lease", str], Any]) -> None:
        ref = weakref.ref(self)
        if self._loop is not None:
            # The native awaitable ends with None once the lease is dropped.
            pending: Awaitable[Optional[str]] = getattr(self._native, which)()

            async def watch() -> None:
                detail = await pending
                lease = ref()
                if detail is None or lease is None or lease._released:
                    return
                got = call(lease, detail)
                del lease
                if inspect.isawaitable(got):
                    await got

            self._tasks.append(self._loop.create_task(watch()))
        else:
            done = self._done
            assert done is not None
            blocking = which + "_blocking"

            def watch_thread() -> None:
                while not done.is_set():
                    native = getattr(ref(), "_native", None)
                    if native is None:
                        return  # dropped: nobody to call
                    try:
                        detail = getattr(native, blocking)(_HANDLER_POLL)
                    except LeaseholdError:
                        return
                    # A lease dropped meanwhile goes here (its release runs in the background).
                    del native
                    if detail is not None:
                        lease = ref()
                        if lease is None or done.is_set():
                            return
                        got = call(lease, detail)
                        del lease
                        if inspect.iscoroutine(got):
                            asyncio.run(got)
                        return

            threading.Thread(target=watch_thread, name=f"leasehold-handler-{self.key}", daemon=True).start()

    @property
    def key(self) -> str:
        """The key."""
        return self._native.key

    @property
    def fence(self) -> int:
        """The fencing token: strictly greater than every earlier lease's on this key."""
        return self._native.fence

    @property
    def holder(self) -> str:
        """The holder identity the lease was taken with."""
        return self._native.holder

    @property
    def token(self) -> str:
        """This acquisition's token: tells this lease from a later one of the same holder."""
        return self._native.token

    @property
    def valid_until(self) -> float:
        """The lease is surely valid until then and not after, on ``time.monotonic()``'s scale.
        Moves forward with each renewal."""
        return self._native.valid_until

    @property
    def stop_by(self) -> float:
        """When work under the lease should stop if renewals keep failing (``valid_until`` less
        the loss grace), on ``time.monotonic()``'s scale."""
        return self._native.stop_by

    @property
    def is_current(self) -> bool:
        """Whether the lease is still held: not lost, not released."""
        return self._native.is_current

    @property
    def is_handoff_requested(self) -> bool:
        """Whether someone has asked for the lease (see :meth:`handoff_requested`)."""
        return self._native.is_handoff_requested

    @property
    def record(self) -> Dict[str, Any]:
        """The key's record as it was when the lease was taken (holder, fence, times, labels)."""
        return cast(Dict[str, Any], json.loads(self._native.record))

    async def lost(self) -> str:
        """Completes, with why, when the lease is lost (expired, taken over, freed by an
        operator, or the store unreachable until it could have expired). A ``with`` block that
        awaited this does not raise :class:`LeaseLost` on exit."""
        self._loss_seen = True
        return cast(str, await self._native.lost())  # None only once the lease is dropped

    def lost_sync(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks up to ``timeout`` seconds for the lease to be lost: why, or ``None``."""
        self._loss_seen = True
        return self._native.lost_blocking(timeout)

    async def handoff_requested(self) -> str:
        """Completes with the waiter's identity when someone waits for the lease: stop the work
        under the lease (checkpoint), then release, and the lease goes to that waiter."""
        return cast(str, await self._native.handoff_requested())  # None once dropped

    def handoff_requested_sync(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks up to ``timeout`` seconds for a waiter: its identity, or ``None``."""
        return self._native.handoff_requested_blocking(timeout)

    async def must_stop(self) -> str:
        """Completes, with why, when work under the lease must stop: renewals have failed into
        the loss grace before ``valid_until``, or the lease is lost."""
        return await self._native.must_stop()

    def _finish(self) -> None:
        self._released = True
        if self._done is not None:
            self._done.set()
        if not self._tasks or self._loop is None:
            return
        try:
            running: Optional[asyncio.AbstractEventLoop] = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        current = asyncio.current_task() if running is not None else None
        for task in self._tasks:
            if task is current:
                continue  # a handler releasing the lease it was called for
            if running is self._loop:
                task.cancel()
            else:
                self._loop.call_soon_threadsafe(task.cancel)

    def release(self) -> Awaitable[str]:
        """Releases the lease (awaitable); idempotent. Gives ``"released"``, ``"already
        released"`` or ``"lost: <reason>"`` (it was no longer ours)."""
        self._finish()
        return self._native.release()

    def release_sync(self) -> str:
        """The blocking form of :meth:`release`."""
        self._finish()
        return self._native.release_blocking()

    def _check_exit(self, answer: str, raising: bool) -> None:
        if answer.startswith("lost: ") and not raising and not self._handles_loss and not self._loss_seen:
            raise self._lost_error(answer[len("lost: "):])

    def _exit_sync(self, raising: bool) -> None:
        self._check_exit(self.release_sync(), raising)

    async def _exit_async(self, raising: bool) -> None:
        self._check_exit(await self.release(), raising)

    def __repr__(self) -> str:
        return repr(self._native)

from . import queue  # noqa: E402  (leasehold.queue after a plain import leasehold)
