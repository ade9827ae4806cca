"""Acquire+release cycles per second from Python on one Redis server: the leasehold package
(asyncio tasks and threads) beside redis-py's ``Lock`` (asyncio and threads) and
python-redis-lock's ``Lock`` (threads), and the Rust library's own figure (``leasehold bench``)
on the same server, in the same run. Every worker cycles on a key of its own (no contention): the
figure is each client's cost per uncontended cycle. Rounds are interleaved; the table shows each
row's median over the rounds.

    python bindings/python/bench/redis_locks.py --redis redis://127.0.0.1:6379 \
        --cli target/release/leasehold [--seconds 2] [--rounds 3] [--json]

Build the package optimised first (``scripts/python-package --release``).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import threading
import time
import uuid
from typing import Callable, Dict, List

import redis
import redis.asyncio
import redis_lock

import leasehold

TTL = 30


def run_threads(n: int, seconds: float, make: Callable[[str], Callable[[], None]]) -> float:
    """Cycles per second of ``n`` threads, each repeating ``make(key)()`` on a key of its own."""
    stem = uuid.uuid4().hex[:8]
    cycles = [0] * n
    start = threading.Barrier(n + 1)
    stop = threading.Event()

    def work(i: int) -> None:
        cycle = make(f"bench/{stem}/{i}")
        cycle()  # warm: connections made, scripts loaded
        start.wait()
        count = 0
        while not stop.is_set():
            cycle()
            count += 1
        cycles[i] = count

    threads = [threading.Thread(target=work, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    return sum(cycles) / (time.perf_counter() - t0)


def run_tasks(n: int, seconds: float, make: Callable[[str], Callable[[], "asyncio.Future[None]"]]) -> float:
    """Cycles per second of ``n`` asyncio tasks, each awaiting ``make(key)()`` on its own key."""

    async def main() -> float:
        stem = uuid.uuid4().hex[:8]
        cycles = [0] * n
        stop = asyncio.Event()

        async def work(i: int) -> None:
            cycle = make(f"bench/{stem}/{i}")
            await cycle()
            count = 0
            while not stop.is_set():
                await cycle()
                count += 1
            cycles[i] = count

        tasks = [asyncio.ensure_future(work(i)) for i in range(n)]
        await asyncio.sleep(0.05)
        t0 = time.perf_counter()
        base = sum(cycles)
        await asyncio.sleep(seconds)
        stop.set()
        await asyncio.gather(*tasks)
        return (sum(cycles) - base) / (time.perf_counter() - t0)

    return asyncio.run(main())


def leasehold_tasks(url: str) -> Callable[[str], Callable[[], "asyncio.Future[None]"]]:
    locks = leasehold.connect(url)

    def make(key: str) -> Callable[[], "asyncio.Future[None]"]:
        lock = locks.lock(key, ttl=TTL)

        async def cycle() -> None:
            lease = await lock.acquire(wait=0)
            await lease.release()

        return cycle  # type: ignore[return-value]

    return make


def leasehold_threads(url: str) -> Callable[[str], Callable[[], None]]:
    locks = leasehold.connect(url)

    def make(key: str) -> Callable[[], None]:
        lock = locks.lock(key, ttl=TTL)

        def cycle() -> None:
            lock.acquire(wait=0).result().release_sync()

        return cycle

    return make


def redis_py_threads(url: str) -> Callable[[str], Callable[[], None]]:
    client = redis.Redis.from_url(url)

    def make(key: str) -> Callable[[], None]:
        def cycle() -> None:
            lock = client.lock(key, timeout=TTL)
            assert lock.acquire(blocking=False)
            lock.release()

        return cycle

    return make


def redis_py_tasks(url: str) -> Callable[[str], Callable[[], "asyncio.Future[None]"]]:
    clients: Dict[int, "redis.asyncio.Redis"] = {}

    def make(key: str) -> Callable[[], "asyncio.Future[None]"]:
        async def cycle() -> None:
            loop = id(asyncio.get_running_loop())
            client = clients.get(loop)
            if client is None:
                client = clients[loop] = redis.asyncio.Redis.from_url(url)
            lock = client.lock(key, timeout=TTL)
            assert await lock.acquire(blocking=False)
            await lock.release()

        return cycle  # type: ignore[return-value]

    return make


def python_redis_lock_threads(url: str) -> Callable[[str], Callable[[], None]]:
    client = redis.StrictRedis.from_url(url)

    def make(key: str) -> Callable[[], None]:
        def cycle() -> None:
            lock = redis_lock.Lock(client, key, expire=TTL)
            assert lock.acquire(blocking=False)
            lock.release()

        return cycle

    return make


def rust(cli: str, url: str, n: int, seconds: float) -> float:
    out = subprocess.run(
        [cli, "bench", "--store", url, "--tasks", str(n), "--no-hot", "--duration", f"{seconds}s", "--json"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    runs = json.loads(out)["runs"]
    return float(next(r["per_second"] for r in runs if r["tasks"] == n and r["keys"] == "distinct"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--redis", required=True, help="redis:// URL of the server")
    ap.add_argument("--cli", required=True, help="the leasehold command (release build)")
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    levels = [int(x) for x in a.concurrency.split(",")]
    rows: Dict[str, Dict[int, List[float]]] = {}

    def add(name: str, n: int, value: float) -> None:
        rows.setdefault(name, {}).setdefault(n, []).append(value)

    for _ in range(a.rounds):
        for n in levels:
            add("Rust library (leasehold bench), tasks", n, rust(a.cli, a.redis, n, a.seconds))
            add("leasehold, asyncio tasks", n, run_tasks(n, a.seconds, leasehold_tasks(a.redis)))
            add("leasehold, threads", n, run_threads(n, a.seconds, leasehold_threads(a.redis)))
            add("redis-py Lock, asyncio tasks", n, run_tasks(n, a.seconds, redis_py_tasks(a.redis)))
            add("redis-py Lock, threads", n, run_threads(n, a.seconds, redis_py_threads(a.redis)))
            add("python-redis-lock, threads", n, run_threads(n, a.seconds, python_redis_lock_threads(a.redis)))
    medians = {name: {n: statistics.median(v) for n, v in per.items()} for name, per in rows.items()}
    if a.json:
        print(json.dumps({"load": os.getloadavg(), "rounds": a.rounds, "seconds": a.seconds, "cycles_per_second": medians}))
        return
    base = medians["Rust library (leasehold bench), tasks"]
    print(f"load average {os.getloadavg()[0]:.2f}; median of {a.rounds} interleaved rounds of {a.seconds:g} s")
    print("| client | " + " | ".join(f"{n} × cycles/s | vs Rust" for n in levels) + " |")
    print("|---|" + "---|---|" * len(levels))
    for name, per in medians.items():
        cells = " | ".join(f"{per[n]:,.0f} | {per[n] / base[n]:.2f}×" for n in levels)
        print(f"| {name} | {cells} |")


if __name__ == "__main__":
    main()
