"""Rate limiting core: rates, the three algorithms' maths, re-sent calls, keys, concurrency."""

from __future__ import annotations

import multiprocessing
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
import redis
from django.core.exceptions import ImproperlyConfigured

from django_redispatterns.exceptions import ConfigurationError
from django_redispatterns.ratelimit import Decision, RateLimiter, ratelimit
from django_redispatterns.ratelimit.limiter import hit_many
from django_redispatterns.ratelimit.rates import Rate, parse_rate, validate_rules

ALGORITHMS = ["fixed_window", "sliding_window", "token_bucket"]


@pytest.fixture(autouse=True)
def _every_key_expires(redis_client: redis.Redis) -> Iterator[redis.Redis]:
    """After every scenario: each rate-limit key this module wrote has a TTL (house rule)."""
    yield redis_client
    for key in redis_client.scan_iter(match="rptest:rl:*", count=1000):
        assert redis_client.pttl(key) != -1, key


def rl_keys(client: redis.Redis) -> list[bytes]:
    return list(client.scan_iter(match="rptest:rl:*", count=1000))


# --- rates --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "rate"),
    [("100/s", Rate(100, 1)), ("100/m", Rate(100, 60)), ("1000/h", Rate(1000, 3600)),
     ("10000/d", Rate(10000, 86400)), ("5/10s", Rate(5, 10)), ("10/min", Rate(10, 60)),
     ("3/15m", Rate(3, 900)), ("1000/day", Rate(1000, 86400))],
)
def test_parse_rate_accepts_the_documented_forms(text: str, rate: Rate) -> None:
    assert parse_rate(text) == rate


@pytest.mark.parametrize("text", ["5/x", "0/m", "-1/s", "5 per minute", "1.5/m", "5/", "/m",
                                  "5/0s", "", "5/m/h", "5/400d", "99999999999/s"])
def test_bad_rates_raise_improperly_configured_naming_the_value(text: str) -> None:
    with pytest.raises(ImproperlyConfigured) as info:
        parse_rate(text)
    assert repr(text) in str(info.value)


def test_rate_of_wrong_type_names_it() -> None:
    with pytest.raises(ConfigurationError, match="int"):
        parse_rate(5)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("rules", "named"),
    [
        ([{"path": "^/api/", "rate": "lots"}], "'lots'"),
        ([{"path": "^/api/"}], "needs a 'rate'"),
        ([{"rate": "5/m", "algorithm": "leaky"}], "'leaky'"),
        ([{"rate": "5/m", "key": "ipv4"}], "'ipv4'"),
        ([{"rate": "5/m", "key": "header:"}], "header"),
        ([{"rate": "5/m", "methods": ["FETCH"]}], "'FETCH'"),
        ([{"rate": "5/m", "burst": 3}], "token_bucket"),
        ([{"rate": "5/m", "algorithm": "token_bucket", "burst": 0}], "burst"),
        ([{"rate": "5/m", "path": "("}], "regex"),
        ([{"rate": "5/m", "rtae": 1}], "'rtae'"),
        ("not a list", "list"),
        (["5/m"], "dict"),
    ],
)
def test_validate_rules_names_the_problem(rules: object, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        validate_rules(rules)
    assert named in str(info.value)


def test_decorator_with_a_bad_rate_fails_at_import_time() -> None:
    with pytest.raises(ImproperlyConfigured, match="'5/fortnight'"):
        ratelimit("5/fortnight")


# --- algorithm maths -------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exactly_limit_hits_pass_then_block(algorithm: str) -> None:
    limiter = RateLimiter("5/m", algorithm=algorithm, group="maths")
    decisions = [limiter.hit("client") for _ in range(8)]
    assert [d.allowed for d in decisions] == [True] * 5 + [False] * 3
    assert [d.remaining for d in decisions] == [4, 3, 2, 1, 0, 0, 0, 0]
    assert all(d.limit == 5 for d in decisions)
    assert all(d.retry_after == 0 for d in decisions[:5])
    assert all(0 < d.retry_after <= 60 for d in decisions[5:])
    assert all(0 < d.reset_after <= 60 for d in decisions)
    # other identities are untouched
    assert limiter.hit("other").remaining == 4


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_peek_counts_nothing_and_reset_unblocks(algorithm: str) -> None:
    limiter = RateLimiter("2/m", algorithm=algorithm, group="peek")
    assert limiter.peek("c") == Decision(True, 2, 2, 0.0, 0.0, limiter.rate, "default",
                                         cost=0, partition=limiter.partition_key("c"))
    limiter.hit("c")
    limiter.hit("c")
    for _ in range(3):
        peeked = limiter.peek("c")
        assert not peeked.allowed and peeked.remaining == 0 and peeked.retry_after > 0
    assert limiter.reset("c") is True
    assert limiter.hit("c").allowed
    assert limiter.reset("never-seen") is False


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_rejected_hits_are_not_counted(algorithm: str, redis_client: redis.Redis) -> None:
    limiter = RateLimiter("3/1s", algorithm=algorithm, group="nopenalty")
    for _ in range(3):
        assert limiter.hit("c").allowed
    first_block = limiter.hit("c")
    for _ in range(10):
        assert not limiter.hit("c").allowed
    # hammering while blocked does not push the reset further away
    assert limiter.peek("c").retry_after <= first_block.retry_after
    time.sleep(1.2)
    assert limiter.hit("c").allowed


def test_cost_counts_several_units_and_larger_than_limit_never_passes() -> None:
    for algorithm in ALGORITHMS:
        limiter = RateLimiter("5/m", algorithm=algorithm, group="cost")
        assert limiter.hit("c", 3).remaining == 2
        assert not limiter.hit("c", 3).allowed
        assert limiter.hit("c", 2).remaining == 0
        blocked = limiter.hit("big", 6)
        assert not blocked.allowed and blocked.retry_after > 0
        assert limiter.peek("big").remaining == 5
    with pytest.raises(ValueError):
        RateLimiter("5/m").hit("c", -1)


def test_fixed_window_resets_after_its_period_and_not_on_every_hit(
        redis_client: redis.Redis) -> None:
    limiter = RateLimiter("2/2s", algorithm="fixed_window", group="fw")
    assert limiter.hit("c").allowed
    ttl_first = redis_client.pttl(limiter.key("c"))
    time.sleep(0.5)
    assert limiter.hit("c").allowed
    assert redis_client.pttl(limiter.key("c")) < ttl_first  # not refreshed by the 2nd hit
    assert not limiter.hit("c").allowed
    time.sleep(1.7)
    assert limiter.hit("c").allowed


def test_sliding_window_has_no_boundary_burst() -> None:
    """1 hit, then 3 late in the window, then 4 just after the first hit's window ended:
    the sliding log admits exactly 1 of the last 4 (fixed window admits all 4 — the burst)."""
    admitted = {}
    for algorithm in ("sliding_window", "fixed_window"):
        limiter = RateLimiter("4/2s", algorithm=algorithm, group="boundary")
        start = time.monotonic()
        assert limiter.hit("c").allowed
        time.sleep(1.0)
        assert all(limiter.hit("c").allowed for _ in range(3))
        time.sleep(max(2.15 - (time.monotonic() - start), 0))
        admitted[algorithm] = sum(limiter.hit("c").allowed for _ in range(4))
    assert admitted["sliding_window"] == 1
    assert admitted["fixed_window"] == 4


def test_sliding_window_retry_after_points_at_the_oldest_hit() -> None:
    limiter = RateLimiter("2/3s", algorithm="sliding_window", group="retry")
    limiter.hit("c")
    time.sleep(1.0)
    limiter.hit("c")
    blocked = limiter.hit("c")
    assert not blocked.allowed
    assert 1.0 < blocked.retry_after <= 2.05  # the first hit leaves ~2 s from now
    time.sleep(blocked.retry_after + 0.1)
    assert limiter.hit("c").allowed
    assert not limiter.hit("c").allowed


def test_token_bucket_burst_and_steady_refill() -> None:
    limiter = RateLimiter("1/s", algorithm="token_bucket", burst=3, group="gcra")
    assert [limiter.hit("c").allowed for _ in range(4)] == [True, True, True, False]
    blocked = limiter.peek("c")
    assert 0 < blocked.retry_after <= 1.0  # one token a second
    assert blocked.limit == 3 and blocked.remaining == 0
    time.sleep(blocked.retry_after + 0.1)
    assert [limiter.hit("c").allowed for _ in range(2)] == [True, False]  # exactly one
    time.sleep(3.1)  # three tokens again, never more than the burst
    assert [limiter.hit("c").allowed for _ in range(4)] == [True, True, True, False]


def test_token_bucket_without_burst_allows_limit_at_once() -> None:
    limiter = RateLimiter("10/m", algorithm="token_bucket", group="gcra2")
    assert sum(limiter.hit("c").allowed for _ in range(12)) == 10


# --- a re-sent call counts once ------------------------------------------------------------------


def test_sliding_window_hit_resent_with_the_same_request_id_counts_once() -> None:
    limiter = RateLimiter("3/m", algorithm="sliding_window", group="d4")
    first = limiter.hit("c", request_id="req-1")
    again = limiter.hit("c", request_id="req-1")
    assert first.allowed and again.allowed
    assert limiter.peek("c").remaining == 2
    limiter.hit("c", request_id="req-2")
    limiter.hit("c", request_id="req-3")
    blocked = limiter.hit("c", request_id="req-4")
    assert not blocked.allowed
    assert not limiter.hit("c", request_id="req-4").allowed
    assert limiter.hit("c", request_id="req-3").allowed  # its member is still logged


@pytest.mark.parametrize("algorithm", ["fixed_window", "token_bucket"])
def test_counting_scripts_write_one_key_and_ignore_request_ids(
        redis_client: redis.Redis, algorithm: str) -> None:
    """Fixed window and GCRA keep no per-hit marker (their calls are never re-sent
    instead, see test_ratelimit_faults); a request id does not de-duplicate them."""
    limiter = RateLimiter("3/m", algorithm=algorithm, group="d4-keys")
    assert limiter.hit("c", request_id="same").allowed
    assert limiter.hit("c", request_id="same").remaining == 1
    digest = limiter.digest("c")
    assert [k.decode() for k in redis_client.scan_iter(match=f"*{{{digest}}}*")] == [
        limiter.key("c")]


def test_sliding_window_members_are_request_ids_not_timestamps(
        redis_client: redis.Redis) -> None:
    """limits' moving window keys entries by time; two hits in one µs must both count."""
    limiter = RateLimiter("50/m", algorithm="sliding_window", group="same-instant")
    ids = [f"r{i}" for i in range(30)]
    decisions = hit_many([(limiter, "c", 1, rid) for rid in ids])  # one pipeline
    assert all(d.allowed for d in decisions)
    members = redis_client.zrange(limiter.key("c"), 0, -1)
    assert sorted(m.decode() for m in members) == sorted(ids)  # type: ignore[union-attr]
    assert [d.remaining for d in decisions] == list(range(49, 19, -1))


# --- keys: hashed, tagged, injective, always expiring --------------------------------------------


def test_keys_hold_no_identity_and_every_key_expires(redis_client: redis.Redis) -> None:
    identities = ["203.0.113.7", "2001:db8::1", "alice@example.com", "bob"]
    for algorithm in ALGORITHMS:
        limiter = RateLimiter("2/m", algorithm=algorithm, group="pii")
        for identity in identities:
            for _ in range(3):
                limiter.hit(identity)
    found = rl_keys(redis_client)
    assert len(found) >= 12
    text = b" ".join(found).decode()
    for identity in [*identities, "203.0.113", "2001:db8", "alice", "example"]:
        assert identity not in text
    assert not re.search(r"\d+\.\d+\.\d+\.\d+", text)
    for key in found:
        assert redis_client.pttl(key) > 0, key
        # one hash tag per key, holding a 32-hex digest
        assert re.fullmatch(rb"rptest:rl:\{[0-9a-f]{32}\}:.+", key), key


def test_group_and_identity_pairs_never_collide() -> None:
    pairs = [("a", "b:c"), ("a:b", "c"), ("x", ""), ("", "x"), ("a|b", "c"), ("a", "b|c")]
    digests = {RateLimiter("1/m", group=g).digest(i) for g, i in pairs}
    assert len(digests) == len(pairs)


def test_rates_and_algorithms_keep_separate_counters() -> None:
    a = RateLimiter("1/m", group="g")
    b = RateLimiter("2/m", group="g")
    c = RateLimiter("1/m", algorithm="sliding_window", group="g")
    assert len({a.key("x"), b.key("x"), c.key("x")}) == 3
    assert a.hit("x").allowed and b.hit("x").allowed and c.hit("x").allowed


# --- concurrency -------------------------------------------------------------------------------


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_exact_under_20_threads_x_10_hits(algorithm: str) -> None:
    limiter = RateLimiter("37/m", algorithm=algorithm, group="threads")
    barrier = threading.Barrier(20)

    def worker() -> int:
        barrier.wait()
        return sum(limiter.hit("shared").allowed for _ in range(10))

    with ThreadPoolExecutor(20) as pool:
        admitted = sum(pool.map(lambda _: worker(), range(20)))
    assert admitted == 37


def _process_worker(args: tuple[str, str, int]) -> int:
    redis_url, algorithm, hits = args
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.settings"
    os.environ["REDIS_URL"] = redis_url
    import django

    django.setup()
    from django_redispatterns.ratelimit import RateLimiter as Limiter

    limiter = Limiter("23/m", algorithm=algorithm, group="processes")
    return sum(limiter.hit("shared").allowed for _ in range(hits))


def test_exact_across_processes(redis_url: str) -> None:
    ctx = multiprocessing.get_context("spawn")
    jobs = [(redis_url, algorithm, 15) for algorithm in ALGORITHMS for _ in range(3)]
    with ctx.Pool(3) as pool:
        results = pool.map(_process_worker, jobs)
    for i, algorithm in enumerate(ALGORITHMS):
        assert sum(results[i * 3:(i + 1) * 3]) == 23, algorithm


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_app_server_clock_cannot_change_decisions(algorithm: str,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """RL-04: limits' moving window and django-ratelimit take time from the app server; a
    worker whose clock runs an hour ahead would see an empty window. Ours use Redis TIME."""
    limiter = RateLimiter("3/m", algorithm=algorithm, group="clock")
    assert limiter.hit("c").allowed
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + 3600)
    assert [limiter.hit("c").allowed for _ in range(3)] == [True, True, False]
    assert limiter.peek("c").reset_after <= 60


def test_long_client_chosen_identities_do_not_fill_the_name_cache() -> None:
    from django_redispatterns.ratelimit import limiter as module

    limiter = RateLimiter("2/m", group="long")
    limiter.hit("short")
    before = module._names.cache_info().currsize
    for i in range(20):
        assert limiter.hit("k" * 5000 + str(i)).allowed
    assert module._names.cache_info().currsize == before
    assert limiter.hit("k" * 5000 + "0").remaining == 0  # still counted per identity
