"""Lock waiters woken across processes: ours (release pushes a wake-up, waiters BLPOP)
against python-redis-lock (the same idea, its own protocol).

Workload (both sides): each worker thread runs ``CYCLES`` cycles of lock -> GET counter ->
SET counter+1 -> unlock on one name. Reported per contender, median of ``RUNS`` runs:
the longest and the 99th-percentile wait for the lock (from calling acquire to holding
it), and cycles per second. Two shapes: 8 threads in one process, and 4 processes x 2
threads (waiters in other processes can only be woken through Redis). The final counter
is checked (a lost update would mean two holders at once).
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import threading
import time
from typing import Any

CYCLES = 200
RUNS = 3
SHAPES = (("8 threads, 1 process", 1, 8), ("4 processes x 2 threads", 4, 2))
CONTENDERS = ("django-redispatterns Lock", "python-redis-lock Lock")


def _setup() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()


def _cycle_factory(contender: str, name: str) -> Any:
    import redis_lock

    from django_redispatterns import connection
    from django_redispatterns.conf import get_config
    from django_redispatterns.locks import Lock
    from tests.redis_servers import KEY_PREFIX

    raw = connection.client_for(get_config().connection_for("LOCKS"))
    counter = f"{KEY_PREFIX}:bench:wakeup:{name}:counter"

    def body() -> None:
        value = int(raw.get(counter) or 0)
        raw.set(counter, value + 1, px=600_000)

    def timed(lock: Any) -> float:
        """One cycle; returns how long acquiring took."""
        started = time.perf_counter()
        lock.acquire()
        waited = time.perf_counter() - started
        body()
        lock.release()
        return waited

    if contender == CONTENDERS[0]:
        return lambda: timed(Lock(name, ttl=10, wait=30))
    return lambda: timed(redis_lock.Lock(raw, f"{KEY_PREFIX}:bench:wakeup:{name}:prl",
                                         expire=10))


def _threads(contender: str, name: str, threads: int, start: Any) -> list[float]:
    cycle = _cycle_factory(contender, name)
    waits: list[list[float]] = [[] for _ in range(threads)]

    def run(i: int) -> None:
        start.wait()
        for _ in range(CYCLES):
            waits[i].append(cycle())

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    return [w for per in waits for w in per]


def _process(contender: str, name: str, threads: int, start: Any, out: Any) -> None:
    _setup()
    out.put(_threads(contender, name, threads, start))


def _one_run(contender: str, name: str, processes: int, threads: int) -> dict[str, float]:
    from django_redispatterns import connection
    from django_redispatterns.conf import get_config
    from tests.redis_servers import KEY_PREFIX

    raw = connection.client_for(get_config().connection_for("LOCKS"))
    counter = f"{KEY_PREFIX}:bench:wakeup:{name}:counter"
    raw.delete(counter)
    ctx = multiprocessing.get_context("spawn")
    if processes == 1:
        barrier = threading.Barrier(threads + 1)
        result: list[float] = []
        runner = threading.Thread(target=lambda: result.extend(
            _threads(contender, name, threads, barrier)))
        runner.start()
        barrier.wait()
        started = time.perf_counter()
        runner.join()
        elapsed = time.perf_counter() - started
        waits = result
    else:
        start = ctx.Event()
        out = ctx.Queue()
        procs = [ctx.Process(target=_process, args=(contender, name, threads, start, out))
                 for _ in range(processes)]
        for p in procs:
            p.start()
        time.sleep(3)  # let every child set Django up before the clock starts
        started = time.perf_counter()
        start.set()
        waits = [w for _ in procs for w in out.get(timeout=300)]
        elapsed = time.perf_counter() - started
        for p in procs:
            p.join(60)
    total = processes * threads * CYCLES
    assert int(raw.get(counter) or 0) == total, "lost update: two holders at once"
    waits.sort()
    return {"max": waits[-1] * 1000, "p99": waits[int(len(waits) * 0.99) - 1] * 1000,
            "rate": total / elapsed}


def run() -> None:
    from django.conf import settings

    os.environ["REDIS_URL"] = settings.REDIS_URL  # the children use the same server
    for shape, processes, threads in SHAPES:
        print(f"\n## lock waiters woken: {shape}, {CYCLES} cycles each "
              f"(lock -> GET -> SET+1 -> unlock), median of {RUNS} runs")
        print(f"{'contender':<32} {'max wait ms':>12} {'p99 wait ms':>12} {'cycles/s':>10}")
        medians: dict[str, dict[str, float]] = {}
        runs: dict[str, list[dict[str, float]]] = {c: [] for c in CONTENDERS}
        for i in range(RUNS):  # interleaved, so load changes hit both sides alike
            for contender in CONTENDERS:
                runs[contender].append(_one_run(contender, f"wake-{processes}-{i}",
                                                processes, threads))
        for contender in CONTENDERS:
            medians[contender] = {k: statistics.median(r[k] for r in runs[contender])
                                  for k in ("max", "p99", "rate")}
            m = medians[contender]
            print(f"{contender:<32} {m['max']:>12.1f} {m['p99']:>12.1f} {m['rate']:>10,.0f}")
        ours, theirs = (medians[c] for c in CONTENDERS)
        print(f"{'ratio ours/theirs':<32} {ours['max'] / theirs['max']:>12.2f} "
              f"{ours['p99'] / theirs['p99']:>12.2f} {ours['rate'] / theirs['rate']:>10.2f}")
