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

Semaphores and read-write locks are held the same way::

    async with locks.semaphore("render-slots", 4) as permit:   # at most 4 holders
        ...
    async with locks.read_write("catalog").read() as reader:    # shared with readers
        ...

Store calls run on the library's own threads with the GIL released (in asyncio code, open the
store with ``await connect_async(url)``). Linux only. Every store URL the command takes works
here (``file://``, ``redis://``, ``k8s://``, ``gs://``, ``s3://``, ``az://``, ``postgres://``,
``etcd://``, ``redlock://``, ``memory://``).
"""

from __future__ import annotations

from . import _native
from . import errors
from ._lease import Lease, ReleaseRequested, RenewalError
from ._locks import Acquiring, Lock, LockKeywords, Locks, ReadWrite, connect, connect_async, settle
from .errors import *  # noqa: F403  (every exception class, listed in errors.__all__)

__version__: str = _native.__version__

__all__ = [
    "connect",
    "connect_async",
    "settle",
    "Locks",
    "Lock",
    "ReadWrite",
    "Acquiring",
    "Lease",
    "LockKeywords",
    "ReleaseRequested",
    "RenewalError",
]
__all__ += errors.__all__

from . import queue  # noqa: E402  (leasehold.queue after a plain import leasehold)
