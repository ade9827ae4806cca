"""A second process for the package's tests: ``child.py MODE URL KEY ...``.

- ``cycle URL KEY N LOG``: N times take the lease, append ``in FENCE PID`` and ``out FENCE PID``
  to LOG around a short piece of work, release.
- ``permits URL KEY KIND N LOG``: as ``cycle``, with a permit instead of the lock: KIND is
  ``semaphore:COUNT``, ``read`` or ``write``; the lines are ``in FENCE PID KIND``.
- ``wait URL KEY HOLDER``: print ``waiting``, wait for the lease as HOLDER, print ``got FENCE T``
  (``T``: ``time.monotonic()`` when granted), release.
- ``interrupt URL KEY HOLDER``: print ``waiting``, wait for the lease as HOLDER in a blocking
  call (its place in line lasting 60 s); on Ctrl-C (SIGINT) print ``interrupted``, then stay
  alive until stdin closes.
"""

import os
import signal
import sys
import time

import leasehold


def append(log: str, text: str) -> None:
    fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, (text + "\n").encode())
    finally:
        os.close(fd)


def main() -> None:
    mode, url, key = sys.argv[1:4]
    if mode == "cycle":
        n, log = int(sys.argv[4]), sys.argv[5]
        locks = leasehold.connect(url)
        for _ in range(n):
            with locks.lock(key, ttl=10).acquire(wait=60) as lease:
                append(log, f"in {lease.fence} {os.getpid()}")
                time.sleep(0.01)  # the work the lease protects
                append(log, f"out {lease.fence} {os.getpid()}")
    elif mode == "permits":
        kind, n, log = sys.argv[4], int(sys.argv[5]), sys.argv[6]
        locks = leasehold.connect(url)
        if kind.startswith("semaphore:"):
            lock = locks.semaphore(key, int(kind.split(":")[1]), ttl=10)
        else:
            rw = locks.read_write(key, ttl=10)
            lock = rw.read() if kind == "read" else rw.write()
        for _ in range(n):
            with lock.acquire(wait=60) as lease:
                append(log, f"in {lease.fence} {os.getpid()} {kind}")
                time.sleep(0.01)  # the work the permit protects
                append(log, f"out {lease.fence} {os.getpid()} {kind}")
    elif mode == "wait":
        locks = leasehold.connect(url, holder=sys.argv[4])
        print("waiting", flush=True)
        lease = locks.lock(key, ttl=10).acquire(wait=60).result()
        print(f"got {lease.fence} {time.monotonic()}", flush=True)
        lease.release_sync()
    elif mode == "interrupt":
        # Ctrl-C as an interactive process gets it: a process started in the background by a
        # shell without job control inherits SIGINT ignored, and Python then keeps it ignored.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        locks = leasehold.connect(url, holder=sys.argv[4])
        print("waiting", flush=True)
        try:
            lease = locks.lock(key, ttl=10, waiter_ttl=60).acquire(wait=120).result()
            print(f"got {lease.fence}", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        sys.stdin.read()  # alive (no exit-time clean-up) until the test is done with it
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
