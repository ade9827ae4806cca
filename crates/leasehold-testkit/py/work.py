"""A command that works under a lock: `work.py LOG WHO SECONDS`.

Appends `<CLOCK_MONOTONIC ns> WHO start` to LOG, prints `working`, works for SECONDS, appends
`<ns> WHO end` and exits 0: the same log lines the other clients' scripts write, on the same clock.
SIGUSR1 (a handoff request, `leasehold run --on-handoff USR1`) ends the work early: it prints
`handoff`, appends `end` and exits 0.
"""

import os
import signal
import sys
import time

log, who, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"{time.monotonic_ns()} {who} start\n".encode())


def handoff(_sig, _frame):
    print("handoff", flush=True)
    os.write(fd, f"{time.monotonic_ns()} {who} end\n".encode())
    os._exit(0)


signal.signal(signal.SIGUSR1, handoff)
print("working", flush=True)
time.sleep(seconds)  # the work itself, not a wait for anything
signal.signal(signal.SIGUSR1, signal.SIG_IGN)
os.write(fd, f"{time.monotonic_ns()} {who} end\n".encode())
