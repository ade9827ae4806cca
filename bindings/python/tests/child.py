"""A second process for the package's tests: ``child.py MODE URL KEY ...``.

- ``cycle URL KEY N LOG``: N times take the lease, append ``in FENCE PID`` and ``out FENCE PID``
  to LOG around a short piece of work, release.
- ``wait URL KEY HOLDER``: print ``waiting``, wait for the lease as HOLDER, print ``got FENCE``,
  release.
"""

import os
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
    elif mode == "wait":
        locks = leasehold.connect(url, holder=sys.argv[4])
        print("waiting", flush=True)
        lease = locks.lock(key, ttl=10).acquire(wait=60).result()
        print(f"got {lease.fence}", flush=True)
        lease.release_sync()
    else:
        raise SystemExit(f"unknown mode {mode}")


if __name__ == "__main__":
    main()
