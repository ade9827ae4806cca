"""A command that works under a lock: `work.py LOG WHO SECONDS`.

Appends `<CLOCK_MONOTONIC ns> WHO start` to LOG, prints `working`, works for SECONDS, appends
`<ns> WHO end` and exits 0: the same log lines the other clients' scripts write, on the same clock.
"""

import os
import sys
import time

log, who, seconds = sys.argv[1], sys.argv[2], float(sys.argv[3])
fd = os.open(log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
os.write(fd, f"{time.monotonic_ns()} {who} start\n".encode())
print("working", flush=True)
time.sleep(seconds)  # the work itself, not a wait for anything
os.write(fd, f"{time.monotonic_ns()} {who} end\n".encode())
