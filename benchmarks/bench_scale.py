"""Scale: what one request costs Redis, and how decisions per second grow with masters.

1. **Per request**, on one private node: Redis commands, bytes on the wire (in + out) and
   Redis CPU (``INFO commandstats`` microseconds) for each feature's hot path, averaged
   over ``OPS`` operations after ``CONFIG RESETSTAT``.
2. **Masters**: ``PROCS`` load processes make rate-limit decisions (fixed window, one
   identity per decision drawn from 100,000) for ``SECONDS`` against a private cluster of
   1, 2 and 3 masters; decisions per second, and each master's CPU use over the run.

``./dev bench scale``. Every redis-server it starts is on ports 30000-30999 (the soak's
cluster nodes) and stopped at the end. On a small shared machine the load processes, not
Redis, are the limit: read part 2 with the per-master CPU next to it.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import time
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.test import override_settings

from django_redispatterns import connection

OPS = 2000
PROCS = int(os.environ.get("BENCH_SCALE_PROCS", "4"))
SECONDS = float(os.environ.get("BENCH_SCALE_SECONDS", "6"))


def _stats(client: Any) -> tuple[int, float, int]:
    """(commands run, those inside scripts included; Redis CPU µs in commands; bytes in +
    out) since the last CONFIG RESETSTAT; our own INFO and CONFIG calls left out."""
    calls = usec = 0.0
    for name, row in client.info("commandstats").items():
        if name in ("cmdstat_config", "cmdstat_info"):
            continue
        calls += int(row["calls"])
        usec += float(row["usec"])
    net = client.info("stats")
    return int(calls), usec, int(net["total_net_input_bytes"]) + int(net["total_net_output_bytes"])


def per_request(url: str) -> list[tuple[str, float, float, float]]:
    """(operation, commands run, µs of Redis CPU, bytes) per operation on ``url``'s node."""
    import redis

    from django_redispatterns.locks import Lock
    from django_redispatterns.ratelimit import RateLimiter
    from django_redispatterns.sessions import SessionStore

    admin = redis.Redis.from_url(url)
    limiters = {a: RateLimiter("1000000/m", algorithm=a)
                for a in ("fixed_window", "sliding_window", "token_bucket")}
    store = SessionStore()
    store["_auth_user_id"] = "7"
    store.save()
    key = store.session_key
    cache_key = f"bench-scale-{random.random()}"
    from django.core.cache import caches

    cache = caches["default"]
    cache.set(cache_key, {"v": 1}, 600)
    operations: dict[str, Callable[[int], object]] = {
        **{f"rate-limit decision ({a})": (lambda i, lim=lim: lim.hit(f"id-{i % 50}"))
           for a, lim in limiters.items()},
        "session read (signed in)": lambda i: SessionStore(key).load(),
        "session save (signed in)": lambda i: _save(key, i),
        "lock acquire + release": lambda i: _lock(Lock),
        "cache hit (get_or_set)": lambda i: cache.get_or_set(cache_key, dict, 600),
    }
    rows = []
    for name, op in operations.items():
        op(0)  # scripts loaded, connections open
        admin.config_resetstat()
        before = _stats(admin)
        for i in range(OPS):
            op(i)
        calls, usec, net = (a - b for a, b in zip(_stats(admin), before, strict=True))
        rows.append((name, calls / OPS, usec / OPS, net / OPS))
    admin.close()
    return rows


def _save(key: str | None, i: int) -> None:
    from django_redispatterns.sessions import SessionStore

    session = SessionStore(key)
    session["n"] = i
    session.save()


def _lock(lock_class: Any) -> None:
    with lock_class("bench-scale", ttl=10, auto_renew=False):
        pass


def _decide(url: str, seconds: float, out: Any) -> None:
    connection.reset_clients()  # a forked child: its own connections
    from django_redispatterns.ratelimit import RateLimiter

    with override_settings(REDIS_PATTERNS={**settings.REDIS_PATTERNS, "CONNECTION": url}):
        limiter = RateLimiter("1000000/m", algorithm="fixed_window")
        rng = random.Random(os.getpid())
        done = 0
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            limiter.hit(f"id-{rng.randrange(100_000)}")
            done += 1
    out.put(done)


def _cpu(node: Any) -> float:
    info = node.client().info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def with_masters(masters: int) -> tuple[float, list[float], float]:
    """Decisions per second from PROCS processes, each master's CPU share meanwhile, and
    the masters' CPU (user + sys, network included) in µs per decision."""
    from soak.cluster import SoakNode
    from tests.topologies import ClusterTopology

    cluster = ClusterTopology(masters=masters, node=SoakNode)
    try:
        nodes = cluster.masters()
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        cpu_before = [_cpu(n) for n in nodes]
        started = time.monotonic()
        procs = [ctx.Process(target=_decide, args=(cluster.url, SECONDS, out))
                 for _ in range(PROCS)]
        for p in procs:
            p.start()
        total = sum(out.get(timeout=SECONDS + 60) for _ in procs)
        for p in procs:
            p.join(30)
        elapsed = time.monotonic() - started
        used = [_cpu(n) - b for n, b in zip(nodes, cpu_before, strict=True)]
        return total / SECONDS, [u / elapsed for u in used], 1e6 * sum(used) / max(1, total)
    finally:
        cluster.stop()


def run() -> None:
    print("\n## scale: per request, one node (averages over "
          f"{OPS} operations; CONFIG RESETSTAT before each)")
    print("| operation | commands run (incl. in scripts) | Redis CPU µs (in commands) "
          "| bytes in + out |")
    print("|---|---:|---:|---:|")
    for name, calls, usec, net in per_request(settings.REDIS_URL):
        print(f"| {name} | {calls:.2f} | {usec:.1f} | {net:,.0f} |")
    print(f"\n## scale: rate-limit decisions per second, {PROCS} load processes, "
          f"{SECONDS:g} s each")
    print("| masters | decisions/s | Redis CPU per master (share of one core) "
          "| Redis CPU µs per decision |")
    print("|---:|---:|---|---:|")
    for masters in (1, 2, 3):
        rate, shares, per = with_masters(masters)
        print(f"| {masters} | {rate:,.0f} | {', '.join(f'{s:.0%}' for s in shares)} "
              f"| {per:.0f} |", flush=True)
