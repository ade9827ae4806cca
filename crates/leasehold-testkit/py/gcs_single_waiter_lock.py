"""The single-waiter Cloud Storage lock of the service leasehold's GCS store replaces, written after
its design (seed 001) over the official `google-cloud-storage` client, run as that service runs it.

The lock is one JSON object with four fields, `ownerId`, `expiresAt` (Unix seconds),
`waitingOwnerId` and `waiterExpiresAt`, and nothing else: every write of this client writes those
four fields only. Every write is conditioned on the generation read (`if_generation_match`; 0 for
a create); a `PreconditionFailed` answer is a `LockContentionError`.

* acquire(): read the object. None → create it (`ownerId` = us, `expiresAt` = now + lease,
  `if_generation_match=0`). Free (`ownerId` null) or expired (`expiresAt` ≤ now on this clock) →
  write ours over it, unless another live waiter is registered (the lock is its next). Held by
  another → register as the waiter (its two fields, the holder's as read) if there is no live
  waiter but us, else `LockContentionError`.
* The waiter polls (every `--poll` s): once the object is gone, free or expired it takes the lock
  as above; while it waits it keeps its registration from lapsing.
* The holder renews every lease/3: read, check `ownerId` is us (else the lock was lost or stolen),
  write `expiresAt` = now + lease conditioned on the generation read (a write that loses its race
  to a waiter's registration is read and checked again). Any other failure is a renewal error:
  the holder stops (`on_renewal_error`).
* The holder checks for a waiter every `--check-every` s (2 s, the design's "fast waiter check"):
  a `waitingOwnerId` other than itself triggers `on_release_requested()`.
* release(): delete the object. The emulator ignores a conditional DELETE, so the object is read
  first and deleted only while it is still ours (`if_generation_match` is sent as well).

The process acquires (waiting up to `--timeout` s), works up to `--work` s (or until release is
requested, with `--release-on-request`), then releases. It prints `waiting` once registered as
waiter, `acquired`, `release-requested WAITER`, `released`, `lost REASON`, `contention`, `timeout`
on stdout; with `--log` it appends `<CLOCK_MONOTONIC ns> OWNER start|end|lost` lines to that
shared event log around the time it holds the lock. `--once` makes one acquire() attempt and
exits unless it got the lock.
"""

import argparse
import json
import os
import sys
import threading
import time

from google.api_core import exceptions
from google.auth.credentials import AnonymousCredentials
from google.cloud import storage


class LockContentionError(Exception):
    """Another process holds the lock and the waiter place is taken, or a write lost its race."""


class LockLostError(Exception):
    """The lock was deleted or taken by another owner."""


class LockData:
    def __init__(self, owner_id, expires_at, waiting_owner_id=None, waiter_expires_at=0.0,
                 generation=0):
        self.owner_id = owner_id
        self.expires_at = expires_at
        self.waiting_owner_id = waiting_owner_id
        self.waiter_expires_at = waiter_expires_at
        self.generation = generation

    @classmethod
    def parse(cls, raw, generation):
        d = json.loads(raw)
        expires = d.get("expiresAt")
        return cls(
            d.get("ownerId") or None,
            # A holder without an expiry is held until someone frees it.
            float("inf") if expires is None else float(expires),
            d.get("waitingOwnerId") or None,
            float(d.get("waiterExpiresAt") or 0),
            generation,
        )

    def to_json(self):
        return json.dumps({
            "ownerId": self.owner_id,
            "expiresAt": self.expires_at,
            "waitingOwnerId": self.waiting_owner_id,
            "waiterExpiresAt": self.waiter_expires_at,
        })


class GcsLock:
    def __init__(self, bucket, name, owner_id, lease_seconds=60.0, waiter_check_interval=2.0,
                 poll_interval=1.0, on_release_requested=None, on_renewal_error=None):
        self._blob_name = name
        self._bucket = bucket
        self._owner_id = owner_id
        self._lease = lease_seconds
        self._check_interval = waiter_check_interval
        self._poll_interval = poll_interval
        self._on_release_requested = on_release_requested or (lambda waiter: None)
        self._on_renewal_error = on_renewal_error or (lambda error: None)
        self._generation = None
        self._stop = threading.Event()
        self._threads = []

    # -- the object --------------------------------------------------------------------------

    def _read(self):
        blob = self._bucket.blob(self._blob_name)
        try:
            raw = blob.download_as_bytes()
        except exceptions.NotFound:
            return None
        return LockData.parse(raw, blob.generation)

    def _write(self, data, generation):
        blob = self._bucket.blob(self._blob_name)
        try:
            blob.upload_from_string(data.to_json(), content_type="application/json",
                                    if_generation_match=generation)
        except exceptions.PreconditionFailed as e:
            raise LockContentionError(str(e)) from e
        return blob.generation

    def _waiter_live(self, data, now):
        return data.waiting_owner_id is not None and data.waiter_expires_at > now

    # -- acquire -----------------------------------------------------------------------------

    def acquire(self):
        """True: acquired. False: registered (or still registered) as the waiter.
        Raises LockContentionError when neither is possible now."""
        data = self._read()
        now = time.time()
        if data is None:
            self._generation = self._write(LockData(self._owner_id, now + self._lease), 0)
            self._start_background()
            return True
        free = data.owner_id is None or data.expires_at <= now
        if free:
            if self._waiter_live(data, now) and data.waiting_owner_id != self._owner_id:
                raise LockContentionError(f"reserved for waiter {data.waiting_owner_id}")
            self._generation = self._write(LockData(self._owner_id, now + self._lease),
                                           data.generation)
            self._start_background()
            return True
        if data.owner_id == self._owner_id:
            raise LockContentionError("held by this owner id already")
        if self._waiter_live(data, now) and data.waiting_owner_id != self._owner_id:
            raise LockContentionError(f"waiter place taken by {data.waiting_owner_id}")
        if data.waiting_owner_id == self._owner_id and data.waiter_expires_at - now > self._lease / 2:
            return False  # registered, and fresh
        data.waiting_owner_id = self._owner_id
        data.waiter_expires_at = now + self._lease
        self._write(data, data.generation)
        return False

    def acquire_waiting(self, timeout, on_waiting):
        deadline = time.monotonic() + timeout
        told = False
        while True:
            try:
                if self.acquire():
                    return True
                if not told:
                    on_waiting()
                    told = True
            except LockContentionError:
                pass
            if time.monotonic() >= deadline:
                return False
            time.sleep(self._poll_interval)  # the design's polling waiter

    # -- holding -----------------------------------------------------------------------------

    def _start_background(self):
        self._stop.clear()
        for target in (self._renew_loop, self._waiter_loop):
            t = threading.Thread(target=target, daemon=True)
            t.start()
            self._threads.append(t)

    def _renew(self):
        for _ in range(5):
            data = self._read()
            if data is None or data.owner_id != self._owner_id:
                raise LockLostError(
                    "deleted" if data is None else f"taken over by {data.owner_id}")
            data.expires_at = time.time() + self._lease
            try:
                self._generation = self._write(data, data.generation)
                return
            except LockContentionError:
                continue  # somebody wrote between our read and write: read and check again
        raise LockContentionError("renewal lost its race five times")

    def _renew_loop(self):
        while not self._stop.wait(self._lease / 3):
            try:
                self._renew()
            except Exception as e:  # noqa: BLE001 — the design: any failure invalidates the lock
                self._stop.set()
                self._on_renewal_error(e)
                return

    def _waiter_loop(self):
        asked = False
        while not self._stop.wait(self._check_interval):
            try:
                data = self._read()
            except Exception:  # noqa: BLE001 — the renewal loop judges failures
                continue
            if (not asked and data is not None and data.owner_id == self._owner_id
                    and data.waiting_owner_id not in (None, self._owner_id)):
                asked = True
                self._on_release_requested(data.waiting_owner_id)

    def release(self):
        self._stop.set()
        data = self._read()
        if data is None or data.owner_id != self._owner_id:
            return False
        blob = self._bucket.blob(self._blob_name)
        try:
            blob.delete(if_generation_match=data.generation)
        except (exceptions.NotFound, exceptions.PreconditionFailed):
            return False
        return True


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--emulator", required=True, help="http://127.0.0.1:PORT")
    p.add_argument("--bucket", required=True)
    p.add_argument("--name", required=True, help="the object name")
    p.add_argument("--owner", required=True, help="this process's ownerId")
    p.add_argument("--lease", type=float, default=60.0, help="lease seconds (the design: 60)")
    p.add_argument("--check-every", type=float, default=2.0, help="waiter check period")
    p.add_argument("--poll", type=float, default=1.0, help="waiter poll period")
    p.add_argument("--timeout", type=float, default=60.0, help="how long to wait for the lock")
    p.add_argument("--work", type=float, default=3600.0, help="seconds to hold the lock")
    p.add_argument("--release-on-request", action="store_true")
    p.add_argument("--once", action="store_true", help="one acquire() attempt")
    p.add_argument("--log", help="shared event log")
    a = p.parse_args()

    os.environ["STORAGE_EMULATOR_HOST"] = a.emulator
    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.bucket(a.bucket)
    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if a.log else None

    def log(event):
        if fd is not None:
            os.write(fd, f"{time.monotonic_ns()} {a.owner} {event}\n".encode())

    def say(line):
        print(line, flush=True)

    done = threading.Event()
    lost = []

    def on_release_requested(waiter):
        say(f"release-requested {waiter}")
        if a.release_on_request:
            done.set()

    def on_renewal_error(error):
        log("lost")
        lost.append(error)
        say(f"lost {type(error).__name__}: {error}")
        done.set()

    lock = GcsLock(bucket, a.name, a.owner, a.lease, a.check_every, a.poll,
                   on_release_requested, on_renewal_error)
    if a.once:
        try:
            got = lock.acquire()
        except LockContentionError as e:
            say(f"contention {e}")
            return 0
        if not got:
            say("waiting")
            return 0
    elif not lock.acquire_waiting(a.timeout, lambda: say("waiting")):
        say("timeout")
        return 2
    log("start")
    say("acquired")
    done.wait(a.work)  # the work itself, ended early by a release request or a lost lock
    if lost:
        return 3
    log("end")
    lock.release()
    say("released")
    return 0


if __name__ == "__main__":
    sys.exit(main())
