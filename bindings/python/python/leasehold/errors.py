"""The exceptions leasehold raises: one class per kind of the library's ``Error``.

Every one has ``retryable``: whether trying again can help (a store that did not answer, say),
as opposed to an input that will be refused again.
"""

from __future__ import annotations

__all__ = [
    "LeaseholdError",
    "InvalidKey",
    "InvalidUrl",
    "InvalidOption",
    "FeatureNotEnabled",
    "Timeout",
    "Corrupt",
    "StoreIOError",
    "Unavailable",
    "StoreError",
    "NotSupported",
    "GivenUp",
    "NotFound",
    "LeaseLost",
    "ForkedProcessError",
]


class LeaseholdError(Exception):
    """Base of every leasehold exception."""

    retryable: bool = False


class InvalidKey(LeaseholdError, ValueError):
    """The key is not acceptable (empty, too long, control characters). ``key`` is the key."""

    key: str = ""


class InvalidUrl(LeaseholdError, ValueError):
    """The store URL could not be understood. ``url`` is the URL without credentials."""

    url: str = ""


class InvalidOption(LeaseholdError, ValueError):
    """An option's value cannot work (a TTL of zero, a negative wait). ``option`` names it."""

    option: str = ""


class FeatureNotEnabled(LeaseholdError):
    """The URL names a store this build of leasehold does not include."""


class Timeout(LeaseholdError):
    """``acquire`` waited its whole wait limit and the lease was still held.

    ``key`` is the key, ``holder`` who kept it as last seen, ``waited`` how long (seconds).

    Not a ``TimeoutError``: Python's ``TimeoutError`` is an ``OSError``, and a lock held by
    someone else is not an operating-system error (an ``except OSError`` around file work must not
    swallow it). It is also told apart from an ``asyncio.timeout()`` of the caller's own, which
    raises ``TimeoutError``. Catch ``leasehold.Timeout``.
    """

    key: str = ""
    holder: str = ""
    waited: float = 0.0


class Corrupt(LeaseholdError):
    """The record stored for ``key`` cannot be understood (the next acquire recovers it)."""

    key: str = ""


class StoreIOError(LeaseholdError, OSError):
    """An operating-system error on a local resource (the file store's directory). ``path``."""

    path: str = ""


class Unavailable(LeaseholdError, ConnectionError):
    """The store could not be reached or did not answer in time; a retry may help."""

    retryable = True
    store: str = ""


class StoreError(LeaseholdError):
    """The store refused the request or answered something leasehold does not understand."""

    store: str = ""


class NotSupported(LeaseholdError):
    """The store cannot keep the requested guarantee (it never weakens it silently)."""

    store: str = ""


class GivenUp(LeaseholdError):
    """The acquisition was given up by its caller while the store was retrying it."""

    key: str = ""


class NotFound(LeaseholdError, LookupError):
    """The named thing (a queue task, …) does not exist."""


class LeaseLost(LeaseholdError):
    """The lease was lost while held: it expired, was taken over, freed by an operator, or the
    store stayed unreachable until it could have expired. ``reason`` says which; ``key`` is the
    key. Raised when a ``with`` block ends on a lease lost inside it and nothing handled the loss
    (an ``on_renewal_error`` handler, or a call of ``lost()``)."""

    key: str = ""
    reason: str = ""

    def __init__(self, message: str, *, key: str = "", reason: str = "") -> None:
        super().__init__(message)
        self.key = key
        self.reason = reason


class ForkedProcessError(LeaseholdError, RuntimeError):
    """leasehold was used in a child process forked after the parent had used it: the child has
    the parent's runtime without its threads. Connect in children started with the ``spawn`` or
    ``forkserver`` method, or before the parent first uses leasehold."""
