"""Idempotency keys: per-request cost on a trivial POST, first request and replay.

Contenders, each a full Django request through the test client (same process, same Redis):

* **ours** — ``IdempotencyMiddleware`` (one ``EVALSHA`` to claim, one to store; a replay is
  the claim call alone);
* **django-idempotency-key 1.3.0** ("DIK") configured for several processes, as its docs
  advise: ``CacheKeyStorage`` on the django-redis cache plus ``MultiProcessRedisLock``
  (one global Redis lock around the lookup);
* **trivial middleware** — the floor for the same round trips: one ``EVALSHA`` (``SET NX
  PX``, else ``GET``) before the view and one (``SET PX`` of the body) after it, on the
  same client; a replay is the first call alone. No key parsing, scope, fingerprint, owner
  check, lease renewal, headers or problem answers;
* **bare view** — no idempotency at all.

Also prints Redis round trips per request (packets the client sends; a pipeline is one).
DIK answers the replay with the stored response (``CONFLICT_STATUS_CODE: None``); note that
it is not safe under concurrency (see docs/idempotency.md), so this compares cost only.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Callable
from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.test import Client
from django.test.utils import override_settings
from django.urls import path

from benchmarks.harness import Result, alternating_medians, compare
from django_redispatterns import connection

_TRIVIAL_CLAIM = (b"if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then "
                  b"return false end return redis.call('GET', KEYS[1])")
_TRIVIAL_STORE = b"return redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])"


class TrivialIdempotencyMiddleware:
    """The same round trips as ours, and nothing else (see the module docstring).

    Like ours it decides in ``process_view`` (where a middleware can see which view runs,
    and after CSRF) and stores in ``__call__``, so both pay for URL resolution alike.
    """

    def __init__(self, get_response: Callable[[HttpRequest], Any]) -> None:
        self.get_response = get_response
        client = connection.client_for("default")
        self.claim = client.register_script(_TRIVIAL_CLAIM)
        self.store = client.register_script(_TRIVIAL_STORE)

    def __call__(self, request: HttpRequest) -> Any:
        response = self.get_response(request)
        redis_key = request.__dict__.pop("_trivial_claim", None)
        if redis_key is not None:
            self.store(keys=[redis_key], args=[response.content, 120000])
        return response

    def process_view(self, request: HttpRequest, view: Any, args: Any, kwargs: Any) -> Any:
        key = request.headers.get("Idempotency-Key")
        if request.method != "POST" or key is None:
            return None
        redis_key = "rptest:bench:trivial:" + key
        held = self.claim(keys=[redis_key], args=[b"P", 30000])
        if held is not None:
            return HttpResponse(held, status=201, content_type="application/json")
        request.__dict__["_trivial_claim"] = redis_key
        return None


def _view(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"ok": True, "amount": 100}, status=201)


def _scope(request: HttpRequest) -> str:
    return "bench-user"


try:  # django-idempotency-key is optional (the `bench` extra)
    from idempotency_key.decorators import idempotency_key as _dik_decorator

    _dik_view: Callable[..., Any] | None = _dik_decorator(_view)
except ImportError:  # pragma: no cover
    _dik_view = None

urlpatterns = [path("pay/", _view)]
if _dik_view is not None:
    urlpatterns.append(path("dik/pay/", _dik_view))

BASE_MIDDLEWARE = ["django.middleware.common.CommonMiddleware"]
OURS = [*BASE_MIDDLEWARE, "django_redispatterns.middleware.IdempotencyMiddleware"]
DIK = [*BASE_MIDDLEWARE, "idempotency_key.middleware.IdempotencyKeyMiddleware"]
TRIVIAL = [*BASE_MIDDLEWARE, "benchmarks.bench_idempotency.TrivialIdempotencyMiddleware"]


def _client(middleware: list[str]) -> Client:
    """A test client whose handler loaded ``middleware`` (kept after the override ends)."""
    client = Client()
    with override_settings(MIDDLEWARE=middleware):
        client.get("/pay/")  # loads the middleware chain once
    return client


def _poster(client: Client, url: str, keys: Callable[[], str]) -> Callable[[], object]:
    def send() -> object:
        response = client.post(url, b'{"amount": 100}', content_type="application/json",
                               headers={"Idempotency-Key": keys()})
        assert response.status_code == 201, response.content
        return response

    return send


def _round_trips_per_request(send: Callable[[], object], n: int = 200) -> float:
    """Client-side count of packets sent to Redis (a pipeline counts once) per request."""
    from redis.connection import AbstractConnection

    original = AbstractConnection.send_packed_command
    sent = 0

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal sent
        sent += 1
        return original(self, *args, **kwargs)

    AbstractConnection.send_packed_command = counting  # type: ignore[method-assign]
    try:
        for _ in range(n):
            send()
    finally:
        AbstractConnection.send_packed_command = original  # type: ignore[method-assign]
    return sent / n


TRIVIAL_NAME = "trivial middleware, same round trips"
# Many short rounds: each pair (ours, the trivial middleware) runs within a fraction of a
# second, so the per-round ratio sees the same machine load on both sides.
ROUNDS, ROUND_OPS = 41, 60


def _alternating_latency(scenario: str, contenders: dict[str, Callable[[], object]],
                         n: int = 3000) -> None:
    """Median time of one request, the contenders taking turns request by request."""
    medians = alternating_medians(contenders, n)
    ours = medians[next(iter(contenders))]
    floor = medians[TRIVIAL_NAME]
    print(f"\n## {scenario}: median latency, requests alternating one by one ({n} each)")
    for name, median in medians.items():
        print(f"{name:<40} {median * 1e6:>10,.0f} us")
    print(f"  ours / trivial middleware, median latency: {ours / floor:.2f}x")


def _against_the_floor(results: list[Result]) -> None:
    """Time per request, ours over the trivial middleware's, paired round by round."""
    ours, floor = results[0], next(r for r in results if r.contender == TRIVIAL_NAME)
    paired = [f / o for o, f in zip(ours.rates, floor.rates, strict=True)]
    print(f"  ours / trivial middleware, time per request: median {statistics.median(paired):.2f}x"
          f" (rounds {min(paired):.2f}-{max(paired):.2f}x)")


def run() -> None:
    redis_url = settings.REDIS_URL
    overrides = override_settings(
        ROOT_URLCONF="benchmarks.bench_idempotency",
        REDIS_PATTERNS={**settings.REDIS_PATTERNS, "IDEMPOTENCY": {
            "TTL": 120, "SCOPE": "benchmarks.bench_idempotency._scope"}},
        IDEMPOTENCY_KEY={
            "CONFLICT_STATUS_CODE": None,
            "STORAGE": {"CLASS": "idempotency_key.storage.CacheKeyStorage",
                        "CACHE_NAME": "default"},
            "LOCK": {"CLASS": "idempotency_key.locks.redis.MultiProcessRedisLock",
                     "LOCATION": redis_url, "TIMEOUT": 1.0, "TTL": 30},
        },
    )
    with overrides:
        ours, bare = _client(OURS), _client(BASE_MIDDLEWARE)
        trivial = _client(TRIVIAL)
        dik = _client(DIK) if _dik_view is not None else None
        counter = itertools.count()

        def fresh() -> str:
            return f"bench-{next(counter)}"

        def same() -> str:
            return "bench-replay"

        first = {"ours: IdempotencyMiddleware": _poster(ours, "/pay/", fresh),
                 TRIVIAL_NAME: _poster(trivial, "/pay/", fresh)}
        replay = {"ours: IdempotencyMiddleware": _poster(ours, "/pay/", same),
                  TRIVIAL_NAME: _poster(trivial, "/pay/", same)}
        if dik is not None:
            first["django-idempotency-key 1.3.0 (Redis)"] = _poster(dik, "/dik/pay/", fresh)
            replay["django-idempotency-key 1.3.0 (Redis)"] = _poster(dik, "/dik/pay/", same)
        else:
            print("django-idempotency-key not installed: comparing with the bare view only")
        first["bare view (no idempotency)"] = _poster(bare, "/pay/", fresh)
        replay["bare view (no idempotency)"] = _poster(bare, "/pay/", same)

        _against_the_floor(compare(
            "idempotency: trivial POST, first request (new key each time)", first,
            ops=ROUND_OPS, rounds=ROUNDS, warmup=50))
        _against_the_floor(compare(
            "idempotency: trivial POST, replay of a stored response", replay,
            ops=ROUND_OPS, rounds=ROUNDS, warmup=50))

        _alternating_latency("idempotency: first request", first)
        _alternating_latency("idempotency: replay", replay)

        print("\nRedis round trips per request (first / replay):")
        for name in first:
            print(f"  {name:<40} {_round_trips_per_request(first[name]):.1f} / "
                  f"{_round_trips_per_request(replay[name]):.1f}")
