"""Django's own cache tests, run against ``django_redispatterns.cache.RedisCache``.

Django's ``tests/cache/tests.py`` holds the contract every cache backend keeps
(``BaseCacheTests``: the API, versions, key validation, the cache middleware,
``cache_page``, ``django.utils.cache``, i18n keys, ``TemplateResponse``, the ``{% cache %}``
tag) and ``RedisCacheTests``, which runs it on Django's Redis backend. This module fetches
the sdist of the *installed* Django (:mod:`tests.sdists`; skips when offline), unpacks its
``tests/cache/`` into a temporary folder (nothing is copied into this repository) and runs
``RedisCacheTests`` with our backend in a subprocess (``tests/django_cache_runner.py``), on
a private Redis of its own (``clear()`` on their ``KEY_PREFIX`` of ``""`` matches every
cache key of a server).

Every test must pass except those in ``EXPECTED_FAILURES``, each with its reason, and each
of those must really fail (so that the list shrinks when a difference goes away). The
cache is configured with ``ALLOW_NO_TTL``: those tests check "``timeout=None`` means
forever", which our default refuses (docs/cache.md, "Differences from Django's Redis
backend").
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import django
import pytest

from tests.redis_servers import RedisServer
from tests.sdists import private_server, sdist

pytestmark = pytest.mark.slow

# Django's test -> why it fails with our backend (by design, or it cannot be otherwise).
PRIVATE = "reads Django's private RedisCacheClient (cache._cache / cache._class)"
EXPECTED_FAILURES = {
    "test_cache_client_class": PRIVATE,
    "test_get_client": PRIVATE,
    "test_get_connection_pool": PRIVATE,
    "test_get_connection_pool_index": PRIVATE,
    "test_serializer_dumps": PRIVATE,
    "test_client_driver_info": PRIVATE + " (Django 6.1+)",
    "test_incr_write_connection": "mocks RedisCacheClient.get_client, which we never call",
    "test_redis_pool_options": PRIVATE + "; the same options are tested on ours in "
                               "tests/test_cache_options.py",
    "test_delete_many_no_keys": "delete_many() returns the number deleted (django-redis's "
                                "contract, which its own suite checks), Django's None",
}
# Expected failures that pass on some stacks (django-redis 5 returns None for no keys).
MAY_PASS = {"test_delete_many_no_keys"}
# Skipped by Django itself for every Redis backend.
SKIPPED = {"test_cull", "test_cull_delete_when_store_empty", "test_zero_cull"}
RUNNER = Path(__file__).with_name("django_cache_runner.py")


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    yield from private_server()


@pytest.fixture(scope="module")
def django_tests(tmp_path_factory: pytest.TempPathFactory) -> Path:
    version = django.__version__
    archive = sdist("django", version)
    root = tmp_path_factory.mktemp("django-tests")
    prefix = f"django-{version}/tests/cache/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(root, members=members, filter="data")
    return root / f"django-{version}" / "tests"


@pytest.fixture(scope="module")
def outcomes(own_server: RedisServer, django_tests: Path,
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    return _run(own_server, django_tests, tmp_path_factory)


@pytest.fixture(scope="module")
def near_outcomes(own_server: RedisServer, django_tests: Path,
                  tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, str]]:
    """The same suite with ``OPTIONS["NEAR_CACHE"]`` on (docs/cache.md, "Near cache")."""
    return _run(own_server, django_tests, tmp_path_factory, {"RP_NEAR_CACHE": "1"})


def _run(own_server: RedisServer, django_tests: Path,
         tmp_path_factory: pytest.TempPathFactory,
         env: dict[str, str] | None = None) -> dict[str, dict[str, str]]:
    results = tmp_path_factory.mktemp("django-results") / "results.json"
    repo = Path(__file__).resolve().parent.parent
    process = subprocess.run(
        [sys.executable, str(RUNNER), str(django_tests), own_server.url, str(results)],
        cwd=repo, capture_output=True, text=True, timeout=600,
        env={**os.environ, **(env or {})},
    )
    assert results.exists(), process.stdout[-3000:] + process.stderr[-3000:]
    data: dict[str, dict[str, str]] = json.loads(results.read_text())
    return data


def test_djangos_cache_tests_pass_but_the_documented_differences(
        outcomes: dict[str, dict[str, str]]) -> None:
    _passed_but_the_differences(outcomes)


def test_djangos_cache_tests_pass_with_the_near_cache(
        near_outcomes: dict[str, dict[str, str]]) -> None:
    _passed_but_the_differences(near_outcomes)


def _passed_but_the_differences(outcomes: dict[str, dict[str, str]]) -> None:
    ran = outcomes["outcomes"]
    assert len(ran) > 55, ran  # RedisCacheTests really ran (62 in Django 5.2, 71 in 6.1)
    failed = {name for name, outcome in ran.items() if outcome == "failed"}
    unexpected = failed - set(EXPECTED_FAILURES)
    assert not unexpected, "\n\n".join(
        f"{name}:\n{outcomes['details'].get(name, '')}" for name in sorted(unexpected))
    skipped = {name for name, outcome in ran.items() if outcome == "skipped"}
    assert skipped <= SKIPPED, skipped - SKIPPED


def test_expected_failures_still_fail(outcomes: dict[str, dict[str, str]]) -> None:
    """Keep the list honest: an entry that passes must go. (An entry may be absent: each
    Django version has its own tests; the list covers 5.2 and 6.1.)"""
    ran = outcomes["outcomes"]
    passing = [name for name in EXPECTED_FAILURES
               if ran.get(name) == "passed" and name not in MAY_PASS]
    assert not passing, f"listed as expected failures but they pass: {passing}"
    assert sum(ran.get(name) == "failed" for name in EXPECTED_FAILURES) >= 7  # they ran
