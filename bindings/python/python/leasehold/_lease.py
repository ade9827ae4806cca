"""A held lease (``leasehold.Lease``): the Python face of ``src/lease.rs``'s ``Lease``, with the
handlers a lock was given (``on_release_requested``, ``on_renewal_error``)."""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import weakref
from typing import Any, Awaitable, Callable, Dict, List, Optional, Union, cast

from . import _native
from .errors import LeaseholdError, LeaseLost

__all__ = ["Lease", "ReleaseRequested", "RenewalError"]

#: ``on_release_requested(lease, waiter)``: someone waits for the lease (checkpoint and release).
ReleaseRequested = Callable[["Lease", str], Union[None, Awaitable[None]]]
#: ``on_renewal_error(lease, error)``: the lease is lost (``error`` is a :class:`LeaseLost`).
RenewalError = Callable[["Lease", LeaseLost], Union[None, Awaitable[None]]]

# How often a handler thread of a lease taken without an event loop checks that the lease is
# still held (it waits in the library with the GIL released meanwhile).
_HANDLER_POLL = 0.25


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
            blocking = which + "_sync"

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
        return self._native.lost_sync(timeout)

    async def handoff_requested(self) -> str:
        """Completes with the waiter's identity when someone waits for the lease: stop the work
        under the lease (checkpoint), then release, and the lease goes to that waiter."""
        return cast(str, await self._native.handoff_requested())  # None once dropped

    def handoff_requested_sync(self, timeout: Optional[float] = None) -> Optional[str]:
        """Blocks up to ``timeout`` seconds for a waiter: its identity, or ``None``."""
        return self._native.handoff_requested_sync(timeout)

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
        return self._native.release_sync()

    def _check_exit(self, answer: str, raising: bool) -> None:
        if answer.startswith("lost: ") and not raising and not self._handles_loss and not self._loss_seen:
            raise self._lost_error(answer[len("lost: "):])

    def _exit_sync(self, raising: bool) -> None:
        self._check_exit(self.release_sync(), raising)

    async def _exit_async(self, raising: bool) -> None:
        self._check_exit(await self.release(), raising)

    def __repr__(self) -> str:
        return repr(self._native)
