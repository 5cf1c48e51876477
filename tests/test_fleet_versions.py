"""The previous release of this package (built from its git tag into a venv of its own, see
:mod:`tests.fleet`) and this checkout, as two processes on one Redis: a rolling upgrade.

Both run the same requests through the real middleware and decorators: an idempotent POST
on one and its retry on the other is replayed (the view ran once); locks exclude each other
and fencing tokens keep rising; rate-limit counters continue; cache entries read the same.
A record in a format from a newer release is refused (409) or a miss, never misread.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest

from tests.fleet import Peer, current, previous_release
from tests.redis_servers import RedisServer
from tests.sdists import private_server

pytestmark = pytest.mark.slow

# The app both processes serve: an idempotent, rate-limited POST whose view counts its runs.
APP = '''
import sys, types, redis
from django.http import JsonResponse
from django.test import Client
from django.urls import path
from django_redispatterns.ratelimit import ratelimit

def pay(request, n=""):
    runs = redis.Redis.from_url(url).incr(prefix + ":runs:" + request.path)
    return JsonResponse({"run": runs, "by": side})

class Session:  # one client's session on every process (idempotency keys need a scope)
    session_key = "fleet-client"

def with_session(get_response):
    def middleware(request):
        request.session = Session()
        return get_response(request)
    return middleware

limited = ratelimit(rate="4/m", key="ip")(pay)
mod = types.ModuleType("fleet_urls")
mod.urlpatterns = [path("pay/<str:n>", pay), path("limited", limited)]
mod.with_session = with_session
sys.modules["fleet_urls"] = mod

def post(where, key=None):
    extra = {"HTTP_IDEMPOTENCY_KEY": key} if key else {}
    r = Client().post(where, data='{"amount": 5}', content_type="application/json", **extra)
    return [r.status_code, r.content.decode(), r.headers.get("Idempotent-Replayed")]
'''


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    yield from private_server()


@pytest.fixture(scope="module")
def old() -> Peer:
    return previous_release()


@pytest.fixture(scope="module")
def new() -> Peer:
    return current()


class Fleet:
    def __init__(self, server: RedisServer, old: Peer, new: Peer) -> None:
        self.prefix = "skew-" + secrets.token_hex(4)
        self.url = server.url
        self.peers = {"old": old, "new": new}
        self.settings: dict[str, Any] = {
            "INSTALLED_APPS": ["django_redispatterns"],
            "ALLOWED_HOSTS": ["testserver"],
            "ROOT_URLCONF": "fleet_urls",
            "MIDDLEWARE": ["fleet_urls.with_session",
                           "django_redispatterns.middleware.IdempotencyMiddleware"],
            "REDIS_PATTERNS": {"CONNECTION": self.url, "KEY_PREFIX": self.prefix},
            "CACHES": {"default": {
                "BACKEND": "django_redispatterns.cache.RedisCache", "LOCATION": self.url,
                "KEY_PREFIX": self.prefix + "-cache", "TIMEOUT": 300,
                # The upgrade from 0.1.0: cache.lock() keeps 0.1.0's keys (docs/migration.md).
                "OPTIONS": {"LOCK_KEYS": "patterns"}}},
        }

    def run(self, side: str, code: str, **names: Any) -> Any:
        settings = self.settings
        if side == "old":  # 0.1.0 knows no LOCK_KEYS option
            caches = {"default": {**settings["CACHES"]["default"], "OPTIONS": {}}}
            settings = {**settings, "CACHES": caches}
        return self.peers[side].run(settings, APP + code, url=self.url, prefix=self.prefix,
                                    side=side, **names)


@pytest.fixture
def fleet(server: RedisServer, old: Peer, new: Peer) -> Fleet:
    return Fleet(server, old, new)


@pytest.mark.parametrize("first, retry", [("old", "new"), ("new", "old")])
def test_an_idempotent_post_is_replayed_on_the_other_version(fleet: Fleet, first: str,
                                                             retry: str) -> None:
    key = secrets.token_hex(8)
    status, body, replayed = fleet.run(first, "result = post('/pay/a', key)", key=key)
    assert (status, replayed) == (200, None) and '"run": 1' in body and first in body
    again = fleet.run(retry, "result = [post('/pay/a', key), post('/pay/a', key)]", key=key)
    assert again == [[200, body, "true"]] * 2  # byte for byte, the view did not run again


FUTURE_RECORD = '''
import redis
conn = redis.Redis.from_url(url)
before = set(conn.scan_iter(prefix + "*idem*"))
first = post('/pay/f', key)
made = [k for k in conn.scan_iter(prefix + "*idem*") if k not in before]
for k in made:  # rewrite the record in a format of a later release
    conn.set(k, b"D2 " + conn.get(k)[2:], keepttl=True)
result = [first[0], len(made), post('/pay/f', key)[0]]
'''


@pytest.mark.parametrize("side", ["old", "new"])
def test_an_idempotency_record_of_a_newer_format_is_refused(fleet: Fleet, side: str) -> None:
    first, made, retry = fleet.run(side, FUTURE_RECORD, key=secrets.token_hex(8))
    assert (first, made) == (200, 1)
    assert retry == 409  # never replayed as something else, never run again


LOCK = '''
from django_redispatterns.locks import Lock
lock = Lock("nightly", ttl=ttl, auto_renew=False)
got = lock.acquire(wait=wait)
result = [got, lock.fencing_token]
'''

CACHE_LOCK = '''
from django.core.cache import cache
lock = cache.lock("report", timeout=ttl)
result = [lock.acquire(blocking=False), 0]
'''


@pytest.mark.parametrize("code", [LOCK, CACHE_LOCK], ids=["Lock", "cache.lock"])
def test_locks_exclude_each_other_and_fencing_keeps_rising(fleet: Fleet, server: RedisServer,
                                                          code: str) -> None:
    def end_leases() -> None:  # what a holder's lease ending does (it exited holding)
        conn = server.client()
        for key in conn.scan_iter(f"{fleet.prefix}:lock:*held*"):
            conn.delete(key)

    # Each holder exits while holding; its lease (60 s) outlives the next worker's start-up.
    got, fence = fleet.run("old", code, ttl=60, wait=0)
    assert got
    assert fleet.run("new", code, ttl=60, wait=0)[0] is False
    if code is LOCK:
        end_leases()
        got2, fence2 = fleet.run("new", code, ttl=60, wait=0)
        assert got2 and fence2 > fence
        assert fleet.run("old", code, ttl=60, wait=0)[0] is False
        end_leases()
        got3, fence3 = fleet.run("old", code, ttl=60, wait=0)
        assert got3 and fence3 > fence2
    end_leases()


def test_rate_limit_counters_continue_across_versions(fleet: Fleet) -> None:
    two = "result = [post('/limited')[0], post('/limited')[0]]"
    assert fleet.run("old", two) == [200, 200]
    assert fleet.run("new", two) == [200, 200]
    assert fleet.run("new", "result = post('/limited')[0]") == 429
    assert fleet.run("old", "result = post('/limited')[0]") == 429


CACHE = '''
from django.core.cache import cache
mine = {"who": side, "n": [1, 2]}
cache.set("set:" + side, mine)
cache.get_or_set("gos:" + side, lambda: mine, 300)
other = "old" if side == "new" else "new"
result = [cache.get("set:" + other), cache.get("gos:" + other)]
if result[0] is not None:  # the other side ran: its get_or_set entry is a hit here too
    result.append(cache.get_or_set("gos:" + other, lambda: "recomputed", 300))
'''


def test_cache_entries_read_the_same_across_versions(fleet: Fleet) -> None:
    """0.1.0's get_or_set entries (behind a header) and this release's (plain, metadata
    beside) are hits on either side."""
    fleet.run("old", CACHE)
    assert fleet.run("new", CACHE) == [{"who": "old", "n": [1, 2]}] * 3
    assert fleet.run("old", CACHE) == [{"who": "new", "n": [1, 2]}] * 3


def test_a_cache_entry_of_a_newer_format_is_a_miss(fleet: Fleet) -> None:
    code = '''
from django.core.cache import cache
cache.client.get_client().set(cache.make_key("future"), b"\\x00\\x93rp2" + bytes(40), ex=60)
result = [cache.get("future", "MISS"), cache.get_or_set("future", lambda: "fresh", 60)]
'''
    assert fleet.run("new", code) == ["MISS", "fresh"]
