"""Runs Django's own ``RedisCacheTests`` against ``django_redispatterns.cache.RedisCache``.

A script, run in a subprocess by ``tests/test_cache_django.py`` (Django reads its settings
once per process)::

    python tests/django_cache_runner.py DJANGO_TESTS_DIR REDIS_URL RESULTS_JSON

``DJANGO_TESTS_DIR`` is the ``tests/`` folder of the Django sdist matching the installed
Django (its ``cache`` package is imported from there, never copied into this repository).
Settings are the few Django's own ``runtests.py`` gives a test app. Writes
``{test name: "passed" | "failed" | "skipped"}`` plus the failures' tracebacks.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from pathlib import Path
from typing import Any

BACKEND = "django_redispatterns.cache.RedisCache"


def configure(redis_url: str) -> None:
    from django.conf import settings

    settings.configure(
        SECRET_KEY="django-cache-tests",
        USE_TZ=False,
        DATABASES={"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"}},
        INSTALLED_APPS=["django.contrib.contenttypes", "django.contrib.auth",
                        "django.contrib.sessions", "django.contrib.messages", "cache"],
        # Django's cache tests need "None means forever": opted in here, refused by default.
        # RP_NEAR_CACHE=1 runs them with the near cache on (tests/test_cache_near.py).
        CACHES={"default": {"BACKEND": BACKEND, "LOCATION": redis_url,
                            "OPTIONS": {"ALLOW_NO_TTL": True, **(
                                {"NEAR_CACHE": {}} if os.environ.get("RP_NEAR_CACHE")
                                else {})}}},
        TEMPLATES=[{"BACKEND": "django.template.backends.django.DjangoTemplates",
                    "APP_DIRS": True,
                    "OPTIONS": {"context_processors": [
                        "django.template.context_processors.request",
                        "django.contrib.auth.context_processors.auth",
                        "django.contrib.messages.context_processors.messages"]}}],
        MIDDLEWARE=[],
        LANGUAGE_CODE="en",
        PASSWORD_HASHERS=["django.contrib.auth.hashers.MD5PasswordHasher"],
    )


def suite() -> unittest.TestSuite:
    from cache import tests as django_tests  # type: ignore[import-not-found]
    from django.test import override_settings

    # Django's module finds the Redis settings by its own backend's path; ours is a
    # different class, so its test class is re-targeted here, unchanged otherwise.
    params = {"BACKEND": BACKEND, **_default_cache()}
    caches = django_tests.caches_setting_for_tests(
        base=params, exclude=django_tests.redis_excluded_caches)

    @override_settings(CACHES=caches)
    class RedisCacheTests(django_tests.RedisCacheTests):  # type: ignore[misc]
        __unittest_skip__ = False

    RedisCacheTests.__module__ = django_tests.__name__
    RedisCacheTests.__qualname__ = "RedisCacheTests"
    return unittest.defaultTestLoader.loadTestsFromTestCase(RedisCacheTests)


def _default_cache() -> dict[str, Any]:
    from django.conf import settings

    entry = dict(settings.CACHES["default"])
    entry.pop("BACKEND")
    return entry


class Recording(unittest.TextTestResult):
    outcomes: dict[str, str] = {}
    details: dict[str, str] = {}

    def _record(self, test: Any, outcome: str, detail: str = "") -> None:
        name = test.id().rsplit(".", 1)[-1]
        self.outcomes[name] = outcome
        if detail:
            self.details[name] = detail[-3000:]

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._record(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._record(test, "skipped", reason)

    def addExpectedFailure(self, test: Any, err: Any) -> None:
        super().addExpectedFailure(test, err)
        self._record(test, "failed", self._exc_info_to_string(err, test))

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._record(test, "failed", self._exc_info_to_string(err, test))

    def addUnexpectedSuccess(self, test: Any) -> None:
        super().addUnexpectedSuccess(test)
        self._record(test, "passed")


def main(tests_dir: str, redis_url: str, results: str) -> int:
    sys.path.insert(0, tests_dir)
    configure(redis_url)
    import django
    from django.test.runner import DiscoverRunner

    django.setup()

    class Runner(DiscoverRunner):
        def get_resultclass(self) -> Any:
            return Recording

    runner = Runner(verbosity=1, interactive=False)
    runner.setup_test_environment()
    old_config = runner.setup_databases()
    try:
        runner.run_suite(suite())
    finally:
        runner.teardown_databases(old_config)
        runner.teardown_test_environment()
    Path(results).write_text(json.dumps({"outcomes": Recording.outcomes,
                                         "details": Recording.details}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
