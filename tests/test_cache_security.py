"""The cache backend's inherited and convenience APIs keep the house rules: ``@cached``
keys by identity, ``clear()`` deletes only keys it can prove are its own, every
inherited write has a TTL, ``lock()`` has a lease, ``keys()`` never sends ``KEYS``."""

from __future__ import annotations

import asyncio
import datetime
import decimal
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.core.cache import caches

from django_redispatterns.cache import (
    RedisCache,
    UncacheableArgument,
    UnscopedKeysError,
    cached,
)
from django_redispatterns.exceptions import MissingTTLError, RedisPatternsError
from django_redispatterns.locks import Lock
from tests.redis_servers import KEY_PREFIX
from tests.test_cache_support import PREFIX, make_cache, ttl_less_keys


@pytest.fixture
def cache(redis_client: redis.Redis) -> Iterator[Any]:
    backend = caches["patterns"]
    assert isinstance(backend, RedisCache)
    yield backend
    assert not ttl_less_keys(redis_client), "every cache key has a TTL"


# --- @cached keys by identity ----------------------------------------------------------


@pytest.mark.django_db
def test_cached_model_arguments_with_equal_str_do_not_share_an_entry(cache: Any) -> None:
    from django.contrib.auth.models import Permission
    from django.contrib.contenttypes.models import ContentType

    # Two rows with the same display text (a user who can choose that text could
    # otherwise read the other row's cached result).
    ct = ContentType.objects.get_for_model(Permission)
    mine = Permission.objects.create(name="Can read", codename="read_mine", content_type=ct)
    theirs = Permission.objects.create(name="Can read", codename="read_theirs",
                                       content_type=ct)
    assert str(mine) == str(theirs) and repr(mine) == repr(theirs)

    @cached(timeout=60, cache="patterns")
    def secret_of(row: Any) -> str:
        return str(row.codename)

    assert secret_of(mine) == "read_mine"
    assert secret_of(theirs) == "read_theirs"
    assert secret_of.cache_key(mine) != secret_of.cache_key(theirs)  # type: ignore[attr-defined]
    # The same row fetched again is the same entry.
    again = Permission.objects.get(pk=mine.pk)
    assert secret_of.cache_key(again) == secret_of.cache_key(mine)  # type: ignore[attr-defined]
    assert secret_of.invalidate(mine) and secret_of.invalidate(theirs)  # type: ignore[attr-defined]


def test_cached_refuses_unsaved_instances_and_unknown_types(cache: Any) -> None:
    from django.contrib.auth.models import User

    runs: list[Any] = []

    @cached(timeout=60, cache="patterns")
    def describe(thing: Any) -> str:
        runs.append(thing)
        return "x"

    class Printable:
        def __repr__(self) -> str:
            return "same"

    for bad in (User(username="new"), Printable(), object(), [Printable()], {"k": object()}):
        with pytest.raises(UncacheableArgument) as info:
            describe(bad)
        assert isinstance(info.value, TypeError) and isinstance(info.value, RedisPatternsError)
        assert "key=" in str(info.value) or "not saved" in str(info.value)
    assert runs == []

    # key= names the identity explicitly: a template or a callable.
    @cached(timeout=60, key=lambda thing: f"printable:{id(thing)}", cache="patterns")
    def by_callable(thing: Any) -> str:
        return "ok"

    thing = Printable()
    assert by_callable(thing) == "ok"
    assert by_callable.cache_key(thing) == f"printable:{id(thing)}"  # type: ignore[attr-defined]
    by_callable.invalidate(thing)  # type: ignore[attr-defined]


def test_cached_plain_values_are_type_tagged_and_canonical(cache: Any) -> None:
    @cached(timeout=60, cache="patterns")
    def echo(*args: Any, **kwargs: Any) -> Any:
        return args, kwargs

    def k(*args: Any, **kwargs: Any) -> str:
        return str(echo.cache_key(*args, **kwargs))  # type: ignore[attr-defined]

    distinct = [
        (1,), ("1",), (1.0,), (True,), (None,), (b"1",), (decimal.Decimal("1"),),
        ((1,),), ([1],), (frozenset({1}),), ("a,b",), ("a", "b"), ({"a": 1},),
        (uuid.UUID(int=1),), (datetime.date(2026, 1, 2),),
        (datetime.datetime(2026, 1, 2),), (datetime.datetime(2026, 1, 2, tzinfo=datetime.UTC),),
    ]
    keys = [k(*args) for args in distinct]
    assert len(set(keys)) == len(keys)
    # Order-free containers, and the same call spelled two ways, share one key.
    assert k({"a": 1, "b": 2}) == k({"b": 2, "a": 1})
    assert k(frozenset({"x", "y"})) == k(frozenset({"y", "x"}))

    @cached(timeout=60, cache="patterns")
    def report(year: int, month: int = 1) -> str:
        return f"{year}-{month}"

    key = report.cache_key(2026, 1)  # type: ignore[attr-defined]
    assert key == report.cache_key(2026) == report.cache_key(year=2026, month=1)  # type: ignore[attr-defined]
    assert report(2026) == "2026-1"
    assert report.invalidate(year=2026) is True  # type: ignore[attr-defined]


def test_cached_async_functions_key_by_identity_too(cache: Any) -> None:
    @cached(timeout=60, cache="patterns")
    async def lookup(thing: Any) -> str:
        return "x"

    async def run() -> None:
        assert await lookup(1) == "x"
        with pytest.raises(UncacheableArgument):
            await lookup(object())
        assert await lookup.ainvalidate(1) is True  # type: ignore[attr-defined]

    asyncio.run(run())
