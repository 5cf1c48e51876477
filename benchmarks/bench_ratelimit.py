"""Rate limiting: decisions/second and per-decision latency, ours vs the alternatives.

Scenarios (one process, one Redis, interleaved rounds — see benchmarks/harness.py):
1. fixed window: ours vs django-ratelimit's ``is_ratelimited`` vs ``limits`` fixed window,
   and the floor: one bare EVALSHA of ``INCR`` + first-hit ``PEXPIRE`` on the same client;
2. sliding window: ours (exact log) vs ``limits`` moving window and sliding-window counter;
3. token bucket (GCRA): ours vs the floor (none of the anchors has one without a module);
4. middleware on a trivial view (one rule) vs a bare middleware making one EVALSHA of the
   floor script, vs the bare view.
Each scenario also prints our cost relative to the floor, paired per round (the floor's
rate divided by ours in the same round, median over rounds): < 1.10 means within 10 %.
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

from benchmarks.harness import alternating_medians, compare
from django_redispatterns import connection
from django_redispatterns.conf import get_config
from django_redispatterns.ratelimit import RateLimiter
from django_redispatterns.scripts import LuaScript

RATE = "1000000/h"
FLOOR = LuaScript("bench_floor", b"local n = redis.call('INCR', KEYS[1]) "
                                 b"if n == 1 then redis.call('PEXPIRE', KEYS[1], ARGV[1]) end "
                                 b"return n")
FLOOR_TTL = 3_600_000


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
        return FLOOR(client, [key], [FLOOR_TTL])

    return call


def _paired(ours: list[float], base: list[float]) -> float:
    """Our cost relative to ``base``: median over rounds of base rate / our rate."""
    return statistics.median(b / o for o, b in zip(ours, base, strict=True))


def _scenario(title: str, contenders: dict[str, Callable[[], object]],
              floor: str = "raw EVALSHA floor (INCR+PEXPIRE)") -> None:
    results = {r.contender: r for r in compare(title, contenders, ops=1000, rounds=9,
                                               warmup=200)}
    ours = next(iter(results.values()))
    print(f"ours / floor cost, paired per round: x{_paired(ours.rates, results[floor].rates):.3f}")
    _print_latency(contenders)
    first = next(iter(contenders))
    medians = alternating_medians({first: contenders[first], floor: contenders[floor]})
    print(f"ours / floor, median latency, calls alternating one by one: "
          f"x{medians[first] / medians[floor]:.3f}")


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
        "raw EVALSHA floor (INCR+PEXPIRE)": _floor(client),
        "django-ratelimit is_ratelimited": lambda: drl.is_ratelimited(
            request, group="bench", key="ip", rate="1000000/h", increment=True),
        "limits FixedWindow (hit only)": lambda: fixed.hit(item, "bench-fixed", "203.0.113.9"),
        "limits FixedWindow + window stats": lambda: (
            fixed.hit(item, "bench-fixed", "203.0.113.9"),
            fixed.get_window_stats(item, "bench-fixed", "203.0.113.9")),
    })
    _scenario("rate limit decision: sliding window", {
        "ours sliding_window (exact log)": ours("sliding_window"),
        "raw EVALSHA floor (INCR+PEXPIRE)": _floor(client),
        "limits MovingWindow (hit only)": lambda: moving.hit(item, "bench-moving", "203.0.113.9"),
        "limits MovingWindow + window stats": lambda: (
            moving.hit(item, "bench-moving", "203.0.113.9"),
            moving.get_window_stats(item, "bench-moving", "203.0.113.9")),
        "limits SlidingWindowCounter": lambda: counter.hit(item, "bench-counter", "203.0.113.9"),
    })
    _scenario("rate limit decision: token bucket (GCRA)", {
        "ours token_bucket": ours("token_bucket"),
        "raw EVALSHA floor (INCR+PEXPIRE)": _floor(client),
    })

    from django_redispatterns.middleware.ratelimit import RateLimitMiddleware

    def view(request: Any) -> HttpResponse:
        return HttpResponse("ok")

    def bare_middleware(request: Any) -> HttpResponse:
        FLOOR(client, ["rptest:bench:mw:" + request.META["REMOTE_ADDR"]], [FLOOR_TTL])
        return view(request)

    section = dict(get_config().feature("RATELIMIT"))
    rules = [{"path": "^/", "rate": RATE, "algorithm": "fixed_window"}]
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": "rptest",
                                           "RATELIMIT": {**section, "RULES": rules}}):
        middleware = RateLimitMiddleware(view)
        factory = RequestFactory()  # a fresh request each time, for every contender
        title = "per-request overhead: RateLimitMiddleware on a trivial view"
        contenders = {
            "view + RateLimitMiddleware (1 rule)": lambda: middleware(
                factory.get("/", REMOTE_ADDR="203.0.113.9")),
            "view + bare one-EVALSHA middleware": lambda: bare_middleware(
                factory.get("/", REMOTE_ADDR="203.0.113.9")),
            "bare view": lambda: view(factory.get("/", REMOTE_ADDR="203.0.113.9")),
        }
        results = compare(title, contenders, ops=1000, rounds=9, warmup=200)
        ours, bare_mw, bare = (r.rates for r in results)
        added = statistics.median(
            (1 / o - 1 / v) / (1 / b - 1 / v) for o, b, v in zip(ours, bare_mw, bare, strict=True))
        print("ours / bare middleware, per request, paired per round: "
              f"x{_paired(ours, bare_mw):.3f}")
        print(f"added cost over the bare view, ours / bare middleware, paired: x{added:.3f}")
        medians = list(alternating_medians(contenders).values())
        o, b, v = medians
        print(f"median latency, requests alternating one by one: ours / bare middleware "
              f"x{o / b:.3f}; added cost over the bare view x{(o - v) / (b - v):.3f}")
    for key in client.scan_iter(match="rptest:*", count=1000):
        client.unlink(key)
    limits_storage.reset()
