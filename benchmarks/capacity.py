"""Capacity: keys and bytes per record, measured with ``MEMORY USAGE <key> SAMPLES 0``.

``python -m benchmarks.capacity`` prints the table quoted in docs/scale.md; the test suite
(tests/test_capacity.py) runs the same measurement and bounds it. Each record is written
through the public API on an otherwise empty, private redis-server (or ``REDIS_URL``):

* a session: anonymous (a small cart), and signed in (Django's three auth fields plus the
  activity metadata) with its per-user index entry;
* a rate-limit identity, per algorithm, after one hit and after 100 hits in the window
  (fixed window and GCRA keep one small key whatever the request rate: their calls are
  never re-sent, so they need no per-hit request-id marker, no silent duplicate writes);
* an idempotency record holding a 201 with a ~100-byte JSON body;
* a held lock with its fencing counter.

Numbers are for this Redis build (64-bit, jemalloc); Cluster adds a few bytes per key for
the slot index. Key names grow with ``KEY_PREFIX`` (here ``rpcap``).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path

# Its own prefix: the measurement UNLINKs every key under it, never another test's keys.
PREFIX = "rpcap"


@dataclass
class Footprint:
    record: str
    keys: int
    bytes: int
    note: str = ""


def _charge(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"id": "ch_3Nq8f2", "amount": 4200, "currency": "eur",
                         "status": "succeeded", "created": 1700000000}, status=201)


def _idempotent_view() -> Callable[..., HttpResponse]:
    from django.views.decorators.csrf import csrf_exempt

    from django_redispatterns.idempotency import idempotent

    return csrf_exempt(idempotent(scope=lambda request: "user-42")(_charge))


urlpatterns: list[Any] = []


def _urls() -> None:
    if not urlpatterns:
        urlpatterns.append(path("charge/", _idempotent_view()))


def _our_keys(client: Any) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{PREFIX}:*", count=1000))


def _usage(client: Any, keys: list[bytes]) -> int:
    return sum(int(client.memory_usage(k, samples=0) or 0) for k in keys)


@contextmanager
def _fresh(client: Any) -> Iterator[None]:
    for key in _our_keys(client):
        client.unlink(key)
    yield
    for key in _our_keys(client):
        client.unlink(key)


def _measure(client: Any, record: str, write: Callable[[], object], note: str = "",
             baseline: list[bytes] | None = None) -> Footprint:
    with _fresh(client):
        write()
        keys = [k for k in _our_keys(client) if baseline is None or k not in baseline]
        return Footprint(record, len(keys), _usage(client, keys), note)


def measure_all(client: Any) -> list[Footprint]:
    """Write one record of each kind through the public APIs and measure it (under
    ``KEY_PREFIX = PREFIX``, on the connection ``REDIS_PATTERNS`` names)."""
    from django.conf import settings
    from django.test import override_settings

    with override_settings(REDIS_PATTERNS={**settings.REDIS_PATTERNS, "KEY_PREFIX": PREFIX}):
        return _measure_all(client)


def _measure_all(client: Any) -> list[Footprint]:
    from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
    from django.test import Client, override_settings

    from django_redispatterns.locks import Lock
    from django_redispatterns.ratelimit import RateLimiter
    from django_redispatterns.sessions import SessionStore

    rows: list[Footprint] = []

    def anonymous() -> None:
        store = SessionStore()
        store["cart"] = [101, 202]
        store.save()

    def signed_in(sessions: int = 1) -> Callable[[], None]:
        def write() -> None:
            for _ in range(sessions):
                store = SessionStore()
                store[SESSION_KEY] = "42"
                store[BACKEND_SESSION_KEY] = "django.contrib.auth.backends.ModelBackend"
                store[HASH_SESSION_KEY] = "f" * 64
                store.save()
                store.record_activity(("203.0.113.0", "Mozilla/5.0 (X11; Linux x86_64) "
                                       "AppleWebKit/537.36 (KHTML, like Gecko) Chrome/120"))
        return write

    rows.append(_measure(client, "session, anonymous (small cart)", anonymous))
    rows.append(_measure(client, "session, signed in + index entry", signed_in(1),
                         "data hash + the user's index"))
    five = _measure(client, "5 sessions of one user", signed_in(5), "one index for all five")
    rows.append(five)

    for algorithm in ("fixed_window", "sliding_window", "token_bucket"):
        def hits(n: int, algorithm: str = algorithm) -> Callable[[], None]:
            limiter = RateLimiter("1000/m", algorithm=algorithm)
            return lambda: [limiter.hit("198.51.100.23") for _ in range(n)]

        notes = {"fixed_window": ("one counter", "the same counter"),
                 "sliding_window": ("", "one sorted-set member per hit"),
                 "token_bucket": ("one TAT string", "the same string")}[algorithm]
        rows.append(_measure(client, f"rate limit {algorithm}, 1 hit", hits(1), notes[0]))
        rows.append(_measure(client, f"rate limit {algorithm}, 100 hits in window", hits(100),
                             notes[1]))

    def idempotency_record() -> None:
        _urls()
        with override_settings(ROOT_URLCONF=__name__):
            response = Client().post("/charge/", '{"amount": 4200}',
                                     content_type="application/json",
                                     headers={"Idempotency-Key": "8f14e45f-ceea-467f-a0e6"})
            assert response.status_code == 201, response.content

    rows.append(_measure(client, "idempotency record (201, 96 B JSON body)", idempotency_record))

    def lock() -> None:
        Lock("nightly-report", ttl=60, auto_renew=False).acquire()

    rows.append(_measure(client, "lock, held (+ fencing counter)", lock))
    return rows


def table(rows: list[Footprint]) -> str:
    lines = ["| record | keys | bytes (MEMORY USAGE) | note |", "|---|---:|---:|---|"]
    lines += [f"| {r.record} | {r.keys} | {r.bytes:,} | {r.note} |" for r in rows]
    return "\n".join(lines)


def main() -> int:
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "benchmarks.settings")
    import django

    django.setup()
    import redis
    from django.conf import settings
    from django.test import override_settings

    from django_redispatterns import connection

    url = settings.REDIS_URL
    client = redis.Redis.from_url(url)
    connection.reset_clients()
    with override_settings(
        SESSION_ENGINE="django_redispatterns.sessions",
        REDIS_PATTERNS={**settings.REDIS_PATTERNS, "CONNECTION": url},
    ):
        rows = measure_all(client)
    info = client.info("server")
    print(f"Redis {info['redis_version']} ({info.get('arch_bits', '?')}-bit), "
          f"KEY_PREFIX {PREFIX!r}\n")
    print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
