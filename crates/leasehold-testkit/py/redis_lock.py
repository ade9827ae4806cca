"""A lock held with redis-py's `Lock`, as another service holds it: on one Redis server, or on
every node of a Redlock set (as redlock-go and redsync do, each node's key a random token set
with `SET NX PX`).

Takes the lock on every server given (trying all at once every 0.1 s, giving back what it got
when one is taken), keeps it by extending every key to the full TTL every TTL/3, and appends one
line per event to a log shared with other processes: `<CLOCK_MONOTONIC ns> <identity> <event>`,
where event is `renew` after taking and after each extension of every key, `start` and `end`
around its work, `lost` when an extension failed. It prints `locked` once it holds the lock. After
`--work` seconds it logs `end` and exits at once without releasing: the keys stay until their TTL
runs out, as when a pod dies.
"""

import argparse
import os
import sys
import threading
import time

import redis


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--port", type=int, action="append", required=True, help="a server (repeat)")
    p.add_argument("--name", required=True, help="the Redis key")
    p.add_argument("--identity", required=True)
    p.add_argument("--log", required=True, help="the shared event log")
    p.add_argument("--work", type=float, required=True, help="seconds of work under the lock")
    p.add_argument("--ttl-ms", type=int, default=3000)
    a = p.parse_args()

    fd = os.open(a.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def log(event):
        # One write(2) per line on an O_APPEND file: lines of several processes never mix.
        os.write(fd, f"{time.monotonic_ns()} {a.identity} {event}\n".encode())

    ttl = a.ttl_ms / 1000
    locks = [
        redis.Redis(host="127.0.0.1", port=port).lock(a.name, timeout=ttl, thread_local=False)
        for port in a.port
    ]
    while True:
        got = [lock for lock in locks if lock.acquire(blocking=False)]
        if len(got) == len(locks):
            break
        for lock in got:
            lock.release()
        time.sleep(0.1)  # redis-py's own retry pause when blocking
    log("renew")

    def keep():
        while True:
            time.sleep(ttl / 3)
            try:
                for lock in locks:
                    lock.extend(ttl, replace_ttl=True)
            except redis.exceptions.LockError:
                log("lost")
                os._exit(3)
            log("renew")

    threading.Thread(target=keep, daemon=True).start()
    log("start")
    print("locked", flush=True)
    time.sleep(a.work)  # the work itself, not a wait for anything
    log("end")
    os._exit(0)


if __name__ == "__main__":
    main()
