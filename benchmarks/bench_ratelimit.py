"""Rate limiting: decisions/second and per-decision latency, ours vs the alternatives.

Scenarios (one process, one Redis, interleaved rounds — see benchmarks/harness.py):
1. fixed window: ours vs django-ratelimit's ``is_ratelimited`` vs ``limits`` fixed window,
   and the floor: one bare EVALSHA (``INCR``) on the same client;
2. sliding window: ours (exact log) vs ``limits`` moving window and sliding-window counter;
3. token bucket (GCRA): ours vs the floor (none of the anchors has one without a module);
4. middleware overhead on a trivial view (one rule), vs the bare view.
Rates are high enough that every decision is "allowed" (the common path). Ours includes
identity hashing (HMAC), key building and everything the headers need; ``limits`` gets a
plain key and its ``hit()`` answers only yes/no, so it is also shown with the
``get_window_stats()`` call it needs for remaining/reset (ANCHORS 2.1 row 5).
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

from django.http import HttpResponse
from django.test import RequestFactory, override_settings

from benchmarks.harness import compare
from django_redispatterns import connection
from django_redispatterns.conf import get_config
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.scripts import LuaScript

RATE = "1000000/h"
FLOOR = LuaScript("bench_floor", b"return redis.call('INCR', KEYS[1])")


def _latency(fn: Callable[[], object], n: int = 1000) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - started)
    samples.sort()
    return statistics.median(samples) * 1e6, samples[int(n * 0.99)] * 1e6


def _print_latency(contenders: dict[str, Callable[[], object]]) -> None:
    print(f"{'contender':<40} {'p50 µs':>10} {'p99 µs':>10}")
    for name, fn in contenders.items():
        p50, p99 = _latency(fn)
        print(f"{name:<40} {p50:>10.1f} {p99:>10.1f}")


def _floor(client: Any) -> Callable[[], object]:
    key = "rptest:bench:floor"

    def call() -> object:
        return FLOOR(client, [key])

    return call


def _scenario(title: str, contenders: dict[str, Callable[[], object]]) -> None:
    compare(title, contenders, ops=1000, rounds=5, warmup=100)
    _print_latency(contenders)


def run() -> None:
    import django_ratelimit.core as drl
    from limits import parse, storage, strategies

    client = connection.get_client("RATELIMIT", resend=False)  # the one decisions use
    url = client.connection_pool.connection_kwargs
    limits_storage = storage.RedisStorage(f"redis://{url['host']}:{url['port']}/{url.get('db', 0)}")
    item = parse("1000000/hour")
    request = RequestFactory().get("/", REMOTE_ADDR="203.0.113.9")

    def ours(algorithm: str) -> Callable[[], object]:
        limiter = RateLimiter(RATE, algorithm=algorithm, group="bench")
        return lambda: limiter.hit("ip:203.0.113.9")

    fixed = strategies.FixedWindowRateLimiter(limits_storage)
    moving = strategies.MovingWindowRateLimiter(limits_storage)
    counter = strategies.SlidingWindowCounterRateLimiter(limits_storage)
    _scenario("rate limit decision: fixed window", {
        "ours fixed_window": ours("fixed_window"),
        "raw EVALSHA floor (INCR)": _floor(client),
        "django-ratelimit is_ratelimited": lambda: drl.is_ratelimited(
            request, group="bench", key="ip", rate="1000000/h", increment=True),
        "limits FixedWindow (hit only)": lambda: fixed.hit(item, "bench-fixed", "203.0.113.9"),
        "limits FixedWindow + window stats": lambda: (
            fixed.hit(item, "bench-fixed", "203.0.113.9"),
            fixed.get_window_stats(item, "bench-fixed", "203.0.113.9")),
    })
    _scenario("rate limit decision: sliding window", {
        "ours sliding_window (exact log)": ours("sliding_window"),
        "raw EVALSHA floor (INCR)": _floor(client),
        "limits MovingWindow (hit only)": lambda: moving.hit(item, "bench-moving", "203.0.113.9"),
        "limits MovingWindow + window stats": lambda: (
            moving.hit(item, "bench-moving", "203.0.113.9"),
            moving.get_window_stats(item, "bench-moving", "203.0.113.9")),
        "limits SlidingWindowCounter": lambda: counter.hit(item, "bench-counter", "203.0.113.9"),
    })
    _scenario("rate limit decision: token bucket (GCRA)", {
        "ours token_bucket": ours("token_bucket"),
        "raw EVALSHA floor (INCR)": _floor(client),
    })

    from django_redispatterns.middleware.ratelimit import RateLimitMiddleware

    def view(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    section = dict(get_config().feature("RATELIMIT"))
    rules = [{"path": "^/", "rate": RATE, "algorithm": "fixed_window"}]
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": "rptest",
                                           "RATELIMIT": {**section, "RULES": rules}}):
        middleware = RateLimitMiddleware(view)
        factory = RequestFactory()  # a fresh request each time, for both contenders
        _scenario("per-request overhead: RateLimitMiddleware on a trivial view", {
            "view + RateLimitMiddleware (1 rule)": lambda: middleware(
                factory.get("/", REMOTE_ADDR="203.0.113.9")),
            "bare view": lambda: view(factory.get("/", REMOTE_ADDR="203.0.113.9")),
        })
    for key in client.scan_iter(match="rptest:*", count=1000):
        client.unlink(key)
    limits_storage.reset()
