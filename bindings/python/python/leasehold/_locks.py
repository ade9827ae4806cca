"""Opening a store and taking locks on it: the Python face of ``src/locks.rs`` (``connect``,
``Locks``, ``Lock``, the permits of semaphores and read-write locks, ``Acquiring``)."""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import json
from typing import TYPE_CHECKING, Any, Callable, Dict, Generator, Generic, Optional, Tuple, TypedDict, TypeVar, cast

from . import _native
from ._lease import Lease, ReleaseRequested, RenewalError
from .errors import LeaseholdError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["connect", "connect_async", "settle", "Locks", "Lock", "ReadWrite", "Acquiring", "LockKeywords"]

T = TypeVar("T")

#: A lock's handlers: ``(on_release_requested, on_renewal_error)``.
Handlers = Tuple[Optional[ReleaseRequested], Optional[RenewalError]]

_UNSET: Any = object()


class LockKeywords(TypedDict, total=False):
    """The keywords of :meth:`Locks.lock`, :meth:`Locks.semaphore` and :meth:`Locks.read_write`:
    a lock's options and handlers (see :meth:`Locks.lock`). Seconds are ``int`` or ``float``."""

    ttl: Optional[float]
    wait: Optional[float]
    renew_every: Optional[float]
    waiter_ttl: Optional[float]
    register_waiter: bool
    labels: Optional[Dict[str, str]]
    on_release_requested: Optional[ReleaseRequested]
    on_renewal_error: Optional[RenewalError]


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

    def lock(self, key: str, **options: Unpack[LockKeywords]) -> "Lock":
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
        return Lock(self, key, lambda o: self._native.lock(key, o), options)

    def semaphore(self, key: str, permits: int, **options: Unpack[LockKeywords]) -> "Lock":
        """A permit of the semaphore ``key`` of ``permits`` permits (1 to 64), not taken yet: at
        most ``permits`` holders at once, across processes and hosts. Used as a lock is (``with``,
        ``async with``, ``acquire()``, ``try_acquire()``), with the same options; each permit is a
        :class:`Lease` with a fence of its own, above every fence the key gave before. Waiters are
        served in arrival order. Every caller of the key must name the same ``permits``: another
        count, or the key held as a lock, raises :class:`InvalidOption` on acquiring. Stores
        without permits raise :class:`NotSupported`.

        The local layer is not used: permits of one process queue at the store like any other.
        """
        return Lock(self, key, lambda o: self._native.semaphore(key, permits, o), options)

    def read_write(self, key: str, **options: Unpack[LockKeywords]) -> "ReadWrite":
        """The read-write lock ``key``: :meth:`ReadWrite.read` gives a read permit (shared with
        other readers), :meth:`ReadWrite.write` the write permit (alone), each a :class:`Lock`
        with these options. A waiting writer is not overtaken by readers that come after it, and
        fences rise across reads and writes. Errors as for :meth:`semaphore`."""
        return ReadWrite(self, key, options)

    async def inspect(self, key: str) -> Optional[Dict[str, Any]]:
        """The key's record as ``leasehold inspect --json`` shows it, or ``None`` when there is
        none."""
        text = await self._native.inspect(key)
        return None if text is None else json.loads(text)

    def inspect_sync(self, key: str) -> Optional[Dict[str, Any]]:
        """The blocking form of :meth:`inspect`."""
        text = self._native.inspect_sync(key)
        return None if text is None else json.loads(text)

    async def force_release(self, key: str) -> Optional[Dict[str, Any]]:
        """Frees ``key`` whoever holds it, as ``leasehold release --force`` does: the record it
        removed, or ``None`` when the key was free. The holder's next renewal fails and its
        ``lost()`` fires (its handler ``on_renewal_error`` is called)."""
        text = await self._native.force_release(key)
        return None if text is None else json.loads(text)

    def force_release_sync(self, key: str) -> Optional[Dict[str, Any]]:
        """The blocking form of :meth:`force_release`."""
        text = self._native.force_release_sync(key)
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
        make: Callable[[_native.LockOptions], _native.Lock],
        options: LockKeywords,
    ) -> None:
        on_release_requested = options.pop("on_release_requested", None)
        on_renewal_error = options.pop("on_renewal_error", None)
        self._locks = locks
        self.key = key
        # The options, filled once: the native lock checks them (and the key) when acquired.
        self._native = make(_native.LockOptions(**cast(Dict[str, Any], options)))
        self._handlers: Handlers = (on_release_requested, on_renewal_error)
        self._has_handlers = on_release_requested is not None or on_renewal_error is not None

    def acquire(self, wait: Optional[float] = _UNSET) -> "Acquiring[Lease]":
        """Takes the lease, waiting up to ``wait`` seconds (default: the lock's ``wait``).

        The result is awaitable (``lease = await lock.acquire()``), a context manager in either
        form (``with lock.acquire(wait=0) as lease:`` blocks without an event loop), or
        ``lock.acquire().result()`` for a blocking call. Raises :class:`Timeout` when the wait
        limit passes. Cancelling an awaiting acquire (``asyncio.wait_for``, task cancel) leaves
        nothing behind: a grant in flight is released and the waiter registration withdrawn.
        """
        native = self._native if wait is _UNSET else self._native.with_wait(wait)
        return Acquiring(self, False, native)

    def try_acquire(self) -> "Acquiring[Optional[Lease]]":
        """Takes the lease if it is free: the :class:`Lease`, or ``None`` when it is held elsewhere.

        Awaitable, or ``.result()`` for the blocking form; as a context manager it gives ``None``
        when held elsewhere and releases on exit when it got the lease.
        """
        return Acquiring(self, True, self._native)

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


class ReadWrite:
    """The read-write lock on one key, made by :meth:`Locks.read_write`: :meth:`read` and
    :meth:`write` give its permits as :class:`Lock`\\ s, with the options it was made with."""

    def __init__(self, locks: Locks, key: str, options: LockKeywords) -> None:
        self._locks = locks
        self.key = key
        self._options = options

    def read(self) -> Lock:
        """A read permit: shared with other readers, not with a writer, and not granted while a
        writer waits ahead of it."""
        return self._permit(write=False)

    def write(self) -> Lock:
        """The write permit: alone on the key (no reader, no other writer)."""
        return self._permit(write=True)

    def _permit(self, write: bool) -> Lock:
        native, key = self._locks._native, self.key
        return Lock(self._locks, key, lambda o: native.read_write(key, write, o), self._options.copy())

    def __repr__(self) -> str:
        return f"ReadWrite(key={self.key!r}, store={self._locks.store!r})"


class Acquiring(Generic[T]):
    """An acquisition not started yet: await it, use it as a context manager (``with`` or
    ``async with``), or call :meth:`result` to block for it. Nothing happens until one of these.
    """

    __slots__ = ("_lock", "_try", "_native", "_lease")

    def __init__(self, lock: Lock, try_only: bool, native: _native.Lock) -> None:
        self._lock = lock
        self._try = try_only
        self._native = native
        self._lease: Optional[Lease] = None

    def _wrap(self, native: Optional[_native.Lease], loop: Optional[asyncio.AbstractEventLoop]) -> Any:
        if native is None:
            return None
        return Lease(native, self._lock._handlers, loop)

    async def _run(self) -> T:
        lock = self._lock
        cancel = _native.Cancel()
        if self._try:
            pending = self._native.try_acquire(cancel)
        else:
            pending = self._native.acquire(cancel)
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
        if self._try:
            native = self._native.try_acquire_sync()
        else:
            native = self._native.acquire_sync()
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
