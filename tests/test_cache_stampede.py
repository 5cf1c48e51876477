"""Stampede protection under real concurrency: threads, processes, a raising and a killed
computer, stale-while-revalidate, XFetch, wake-ups instead of polling."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import random
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from django_redispatterns import signals
from django_redispatterns.cache import envelope
from tests.redis_servers import CACHE_PREFIX, RedisServer
from tests.test_cache_support import (
    PREFIX,
    counting,
    dying_computer,
    make_cache,
    stampede_worker,
    ttl_less_keys,
    wake_waiter,
)

COUNTER = f"{PREFIX}:count:computes"


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    yield redis_client
    assert not ttl_less_keys(redis_client), "house rule I1: lock and wake keys have TTLs"


def computes(client: redis.Redis) -> int:
    return int(client.get(COUNTER) or 0)


def run_threads(n: int, target: Callable[[], Any]) -> tuple[list[Any], list[float]]:
    """Start ``n`` threads behind a barrier; return their results and latencies."""
    barrier = threading.Barrier(n)
    results: list[Any] = []
    latencies: list[float] = []
    lock = threading.Lock()

    def run() -> None:
        barrier.wait()
        started = time.monotonic()
        try:
            value: Any = target()
        except Exception as exc:  # collected and asserted on by the tests
            value = exc
        with lock:
            results.append(value)
            latencies.append(time.monotonic() - started)

    threads = [threading.Thread(target=run) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return results, latencies


class Recorder:
    """Collects the cache signals sent while it is connected."""

    def __init__(self) -> None:
        self.events: list[tuple[str, dict[str, Any]]] = []
        self._lock = threading.Lock()

    def __enter__(self) -> Recorder:
        for name in ("stale_value_served", "stampede_wait", "stampede_lease_takeover"):
            getattr(signals, name).connect(self._make(name), weak=False,
                                           dispatch_uid=f"rec-{name}")
        return self

    def __exit__(self, *exc: object) -> None:
        for name in ("stale_value_served", "stampede_wait", "stampede_lease_takeover"):
            getattr(signals, name).disconnect(dispatch_uid=f"rec-{name}")

    def _make(self, name: str) -> Callable[..., None]:
        def receive(sender: Any, **kwargs: Any) -> None:
            with self._lock:
                self.events.append((name, kwargs))

        return receive

    def count(self, name: str) -> int:
        return sum(1 for n, _ in self.events if n == name)


# --- single flight ---------------------------------------------------------------------


def test_50_threads_missing_one_key_compute_once(client: redis.Redis, redis_url: str) -> None:
    cache = make_cache(redis_url)
    # Over TLS, 50 fresh connections' handshakes can outlast a short computation on a loaded
    # machine, and late callers then hit rather than wait: the computation outlasts them.
    sleep = 3.0 if redis_url.startswith("rediss://") else 0.3
    compute = counting(client, COUNTER, value={"answer": 42}, sleep=sleep)
    with Recorder() as rec:
        results, _ = run_threads(50, lambda: cache.get_or_set("hot", compute, 60))
    assert computes(client) == 1
    assert results == [{"answer": 42}] * 50
    assert len({id(r) for r in results}) == 50  # each caller got its own copy, as from a GET
    waits = [kw for name, kw in rec.events if name == "stampede_wait"]
    assert len(waits) == 49 and all(kw["waited"] and kw["seconds"] > 0 for kw in waits)


def test_300_readers_at_expiry_compute_once(
    redis_server_factory: Callable[..., RedisServer],
) -> None:
    """ANCHORS 0.5: django-redis's HerdClient lets 11 of 300 (1 s) and 160 of 300 (30 s)
    recompute. Here the key has just expired and 300 readers arrive together."""
    server = redis_server_factory()  # its own URL: django-redis caches pools per URL
    client = server.client()
    # redis-py >= 8 pools hold 100 connections by default; 300 threads each need one for
    # their GET (plain django-redis too). Only one of them waits on Redis for the value.
    cache = make_cache(server.url, XFETCH_BETA=0,
                       CONNECTION_POOL_KWARGS={"max_connections": 400})
    cache.get_or_set("popular", lambda: "v1", 0.2)
    time.sleep(0.3)
    compute = counting(client, COUNTER, value="v2", sleep=0.5)
    results, _ = run_threads(300, lambda: cache.get_or_set("popular", compute, 60))
    assert computes(client) == 1
    assert results == ["v2"] * 300
    assert not ttl_less_keys(client)


def test_waiters_block_on_a_wake_up_list_not_a_poll(
    redis_server_factory: Callable[..., RedisServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    """3 processes x 3 threads wait while this process computes: per process one thread
    blocks in BLMOVE (the others wait on it locally) and all wake when the value lands."""
    server = redis_server_factory()
    probe = server.client()
    monkeypatch.setenv("REDIS_URL", server.url)
    ready = f"{CACHE_PREFIX}:count:ready"
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    procs = [ctx.Process(target=wake_waiter, args=(server.url, "slow", ready, 3, results))
             for _ in range(3)]
    cache = make_cache(server.url, STAMPEDE_LEASE=30, SOCKET_TIMEOUT=10)

    def compute() -> str:
        for p in procs:
            p.start()
        deadline = time.monotonic() + 60
        while int(probe.get(ready) or 0) < 3:  # test code: wait for the children
            assert time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1.0)  # every child thread is waiting now
        before.update(probe.info("commandstats"))
        time.sleep(2.0)  # a poller would hammer Redis here
        return "computed once"

    before: dict[str, Any] = {}
    assert cache.get_or_set("slow", compute, 60) == "computed once"
    landed = time.time()
    got = [results.get(timeout=60) for _ in procs]
    after = probe.info("commandstats")
    for p in procs:
        p.join(30)

    def calls(cmd: str) -> int:
        key = f"cmdstat_{cmd}"
        return int(after.get(key, {}).get("calls", 0)) - int(before.get(key, {}).get("calls", 0))

    assert [v for values, _ in got for v in values] == ["computed once"] * 9
    # During the last 2 s of the compute: at most ~2 BLMOVEs per process (the socket
    # timeout caps one block at 1.75 s), a claim after each, and the settle.
    assert calls("blmove") <= 3 * 2
    assert calls("evalsha") + calls("eval") <= 3 * 3 + 2
    # Woken when the value landed: not at the end of a 9.75 s block, nor of the 30 s lease.
    lags = [t - landed for _, finished in got for t in finished]
    assert max(lags) < 2.0, lags


def stampede_processes(redis_url: str, key: str, processes: int, threads: int,
                       *args: float) -> list[Any]:
    """Run :func:`stampede_worker` in ``processes`` spawned children (``args``: its
    compute time and socket timeout); every value they got."""
    ctx = multiprocessing.get_context("spawn")
    results: Any = ctx.Queue()
    start_at = time.time() + 4  # after every child has imported Django
    procs = [ctx.Process(target=stampede_worker,
                         args=(redis_url, key, COUNTER, threads, start_at, results, *args))
             for _ in range(processes)]
    for p in procs:
        p.start()
    got = [results.get(timeout=60) for _ in procs]
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0] * processes
    return [v for batch in got for v in batch]


def test_processes_and_threads_compute_once(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert stampede_processes(redis_url, "shared", 4, 10) == [{"v": 42}] * 40
    assert computes(client) == 1


def test_processes_compute_once_while_the_computer_extends_its_short_claim(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A 0.5 s socket timeout makes the claim 1.5 s; a 4 s computation outlives it
    several times over and is still the only one: its caller extends the claim."""
    monkeypatch.setenv("REDIS_URL", redis_url)
    assert stampede_processes(redis_url, "long", 3, 2, 4.0, 0.5) == [{"v": 42}] * 6
    assert computes(client) == 1


def test_async_missers_compute_once(client: redis.Redis, redis_url: str) -> None:
    cache = make_cache(redis_url)
    calls = []

    async def produce() -> str:
        calls.append(1)
        await asyncio.sleep(0.3)
        return "async value"

    async def run() -> list[Any]:
        return list(await asyncio.gather(
            *(cache.aget_or_set("async-hot", produce, 60) for _ in range(100))))

    assert asyncio.run(run()) == ["async value"] * 100
    assert calls == [1]


# --- faults ----------------------------------------------------------------------------


def test_raising_computer_fails_alone_and_one_waiter_computes(
    client: redis.Redis, redis_url: str
) -> None:
    cache = make_cache(redis_url, STAMPEDE_LEASE=30)
    attempts: list[int] = []
    lock = threading.Lock()

    def flaky() -> str:
        with lock:
            attempts.append(1)
            first = len(attempts) == 1
        time.sleep(0.3)
        if first:
            raise RuntimeError("first computer fails")
        return "recovered"

    results, latencies = run_threads(20, lambda: cache.get_or_set("flaky", flaky, 60))
    errors = [r for r in results if isinstance(r, Exception)]
    assert len(errors) == 1 and str(errors[0]) == "first computer fails"
    assert results.count("recovered") == 19
    assert len(attempts) == 2  # released at once: not 20 tries, not a 30 s lease wait
    assert max(latencies) < 10
    assert cache.get("flaky") == "recovered"


def test_killed_computer_is_taken_over_after_its_lease(
    client: redis.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REDIS_URL", redis_url)
    ctx = multiprocessing.get_context("spawn")
    proc = ctx.Process(target=dying_computer, args=(redis_url, "orphan", COUNTER))
    proc.start()
    deadline = time.monotonic() + 30
    while computes(client) < 1:  # test code: wait for the child to hold the lock
        assert time.monotonic() < deadline, "child never started computing"
        time.sleep(0.05)
    proc.kill()
    proc.join(10)
    cache = make_cache(redis_url, STAMPEDE_LEASE=1.0)
    compute = counting(client, COUNTER, value="after takeover")
    with Recorder() as rec:
        started = time.monotonic()
        assert cache.get_or_set("orphan", compute, 60) == "after takeover"
        waited = time.monotonic() - started
    assert computes(client) == 2
    assert waited < 5  # bounded by the 1 s lease, not forever
    assert rec.count("stampede_lease_takeover") == 1
    assert not list(client.scan_iter(match=f"{PREFIX}:*rp-lock*"))


def test_waiter_stops_waiting_after_stampede_wait(client: redis.Redis, redis_url: str) -> None:
    slow = make_cache(redis_url, STAMPEDE_LEASE=30)
    impatient = make_cache(redis_url, STAMPEDE_LEASE=30, STAMPEDE_WAIT=0.5)
    holder = threading.Thread(
        target=lambda: slow.get_or_set("glacial", lambda: time.sleep(3) or "slow", 60))
    holder.start()
    time.sleep(0.3)
    started = time.monotonic()
    assert impatient.get_or_set("glacial", lambda: "own", 60) == "own"
    assert time.monotonic() - started < 2.5
    holder.join()


# --- stale-while-revalidate and XFetch -------------------------------------------------


def test_stale_while_revalidate_serves_old_value_while_one_recomputes(
    client: redis.Redis, redis_url: str
) -> None:
    cache = make_cache(redis_url, STALE_TTL=30, XFETCH_BETA=0)
    cache.get_or_set("swr", lambda: "old", 0.5)
    time.sleep(0.7)
    assert cache.get("swr") is None  # plain get: expired is expired
    compute = counting(client, COUNTER, value="new", sleep=1.0)
    with Recorder() as rec:
        results, latencies = run_threads(30, lambda: cache.get_or_set("swr", compute, 60))
    assert computes(client) == 1
    assert results.count("new") == 1 and results.count("old") == 29
    fast = sorted(latencies)[:29]
    assert max(fast) < 0.8  # the stale readers did not wait for the 1 s recompute
    assert rec.count("stale_value_served") == 29
    assert cache.get_or_set("swr", compute, 60) == "new"
    assert 60 < client.pttl(f"{PREFIX}:1:swr") / 1000 <= 90  # TTL + STALE_TTL


def test_xfetch_probability_matches_the_paper() -> None:
    """P(refresh early) = exp(-remaining / (delta * beta)); checked over 20 000 draws."""
    random.seed(1234)
    now = 1000.0
    entry = envelope.Entry("v", b"", soft_expiry=now + 0.5, delta=1.0)
    for beta, remaining in ((1.0, 0.5), (2.0, 0.5), (1.0, 3.0)):
        entry = envelope.Entry("v", b"", soft_expiry=now + remaining, delta=1.0)
        hits = sum(entry.refresh_early(now, beta) for _ in range(20_000))
        expected = math.exp(-remaining / beta)
        assert abs(hits / 20_000 - expected) < 0.02, (beta, remaining, hits)
    assert not entry.refresh_early(now, 0.0)  # beta 0 turns it off
    forever = envelope.Entry("v", b"", soft_expiry=math.inf, delta=1.0)
    assert not forever.refresh_early(now, 1.0)


@pytest.mark.parametrize("beta", [3.0, 0.0])
def test_xfetch_keeps_a_hot_key_from_ever_missing(
    client: redis.Redis, redis_url: str, beta: float
) -> None:
    """C-09: a hot key is recomputed by one reader shortly before it expires, so readers
    never see it missing. beta=0 (XFetch off) is the control that must see misses."""
    cache = make_cache(redis_url, XFETCH_BETA=beta)
    running = []

    def compute() -> str:
        running.append(1)
        assert len(running) == 1, "two recomputes at once"
        client.incr(COUNTER)
        client.expire(COUNTER, 60)
        time.sleep(0.1)
        running.pop()
        return "fresh"

    cache.get_or_set("xf", compute, 1.5)
    misses = []
    stop = time.monotonic() + 4.0

    def reader() -> None:
        while time.monotonic() < stop:
            if cache.get("xf") is None:
                misses.append(1)
            cache.get_or_set("xf", compute, 1.5)
            time.sleep(0.005)

    threads = [threading.Thread(target=reader) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    n = computes(client)
    if beta == 0:  # the control: without XFetch the readers see the expiries
        assert len(misses) >= 2, misses
        return
    # About one recompute per window, ahead of expiry by ~ delta*beta*ln(reads/s * delta*beta)
    # (earlier the more readers there are), never two at once.
    assert 3 <= n <= 14, n
    assert len(misses) <= 1  # refreshed before it expired, not after
