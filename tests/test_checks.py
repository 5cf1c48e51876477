"""Static system checks: each fires on its bad setting, stays quiet on the good one.

These read settings only; none of them may touch the network.
"""

from __future__ import annotations

import pickle
import re
import time
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth.middleware import AuthenticationMiddleware
from django.core import checks as django_checks
from django.core.management import call_command
from django.test import override_settings
from django_redis.cache import RedisCache as DjangoRedisCache

from django_redispatterns import checks
from django_redispatterns.checks import (
    E001,
    E008,
    E009,
    E010,
    MESSAGES,
    W001,
    W002,
    W003,
    W004,
)

AUTH = "django.contrib.auth.middleware.AuthenticationMiddleware"
SESSION = "django.contrib.sessions.middleware.SessionMiddleware"
IDEM = "django_redispatterns.middleware.IdempotencyMiddleware"
LIMIT = "django_redispatterns.middleware.RateLimitMiddleware"
ACTIVITY = "django_redispatterns.middleware.SessionActivityMiddleware"
OUR_ENGINE = "django_redispatterns.sessions"
UNREACHABLE = "redis://127.0.0.1:1/0"


def ids(messages: list[Any]) -> list[str]:
    return [m.id for m in messages]


def redis_cache(backend: str, **entry: Any) -> dict[str, Any]:
    return {"default": {"BACKEND": backend, "LOCATION": UNREACHABLE, **entry}}


# --- the message catalogue ---------------------------------------------------------------


def test_every_message_has_a_unique_id_and_a_hint() -> None:
    full = [f"redispatterns.{m.id}" for m in MESSAGES]
    assert len(set(full)) == len(full)
    for message in MESSAGES:
        assert re.fullmatch(r"[EWI]\d{3}", message.id)
        assert message.level.__name__[0] == message.id[0]
        assert message.hint


def test_every_check_id_is_documented_with_cause_and_fix() -> None:
    doc = (Path(__file__).resolve().parent.parent / "docs" / "checks.md").read_text()
    for message in MESSAGES:
        assert f"`redispatterns.{message.id}`" in doc, f"{message.id} missing from docs/checks.md"


# --- E001 / W001: caches without TTL -----------------------------------------------------


@pytest.mark.parametrize("backend", [
    "django_redis.cache.RedisCache",
    "django.core.cache.backends.redis.RedisCache",
    "django_redispatterns.cache.RedisCache",
])
def test_redis_cache_with_timeout_none_is_an_error(backend: str) -> None:
    # Django's own RedisCache counts as Redis too (django-ratelimit #283 flagged it).
    with override_settings(CACHES=redis_cache(backend, TIMEOUT=None)):
        assert checks.check_cache_ttls() == [E001(obj="CACHES['default']", alias="default")]
    with override_settings(CACHES=redis_cache(backend, TIMEOUT=300)):
        assert checks.check_cache_ttls() == []
    with override_settings(CACHES=redis_cache(backend)):  # Django's default, 300 s
        assert checks.check_cache_ttls() == []


def test_allow_no_ttl_turns_the_error_into_a_warning() -> None:
    caches = redis_cache("django_redispatterns.cache.RedisCache", TIMEOUT=None,
                         OPTIONS={"ALLOW_NO_TTL": True})
    with override_settings(CACHES=caches):
        assert checks.check_cache_ttls() == [W001(obj="CACHES['default']", alias="default")]


def test_non_redis_caches_are_not_our_business() -> None:
    caches = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache",
                          "TIMEOUT": None}}
    with override_settings(CACHES=caches):
        assert checks.check_cache_ttls() == []


class ProjectCache(DjangoRedisCache):
    """A project's own subclass of django-redis is still Redis-backed."""


def test_a_subclass_of_a_redis_backend_counts() -> None:
    with override_settings(CACHES=redis_cache(f"{__name__}.ProjectCache", TIMEOUT=None)):
        assert ids(checks.check_cache_ttls()) == ["redispatterns.E001"]


# --- E002 / E003 / E004 / E010: REDIS_PATTERNS -------------------------------------------


@pytest.mark.parametrize(("raw", "named"), [
    ({"LOCKS": {"TLL": 3}}, "TLL"),
    ({"KEY_PERFIX": "x"}, "KEY_PERFIX"),
    ({"IDEMPOTENCY": {"TTL": "1d"}}, "['IDEMPOTENCY']['TTL']"),
    ({"RATELIMIT": {"RULES": "100/m"}}, "['RATELIMIT']['RULES']"),
    ("redis://localhost", "REDIS_PATTERNS"),
])
def test_malformed_redis_patterns_is_one_error_naming_the_key(raw: Any, named: str) -> None:
    with override_settings(REDIS_PATTERNS=raw):
        messages = checks.check_settings()
    assert ids(messages) == ["redispatterns.E002"]
    assert named in messages[0].msg
    assert messages[0].level == django_checks.ERROR


@pytest.mark.parametrize("rule", [
    {"path": r"^/api/", "rate": "5/x"},
    {"path": r"^/api/", "rate": "0/m"},
    {"path": r"^/api/", "rate": "100 per minute"},
    {"path": r"^/api/(", "rate": "5/m"},
    {"path": r"^/api/", "rate": "5/m", "algorithm": "leaky"},
    {"path": r"^/api/", "rate": "5/m", "key": "ip", "bogus": 1},
])
def test_bad_rate_limit_rules_are_an_error(rule: dict[str, Any]) -> None:
    pytest.importorskip("django_redispatterns.ratelimit.rates")
    with override_settings(REDIS_PATTERNS={"RATELIMIT": {"RULES": [rule]}}):
        messages = checks.check_settings()
    assert ids(messages) == ["redispatterns.E003"], messages
    assert "RULES'][0]" in messages[0].msg


def test_good_rate_limit_rules_are_quiet() -> None:
    pytest.importorskip("django_redispatterns.ratelimit.rates")
    rules = [{"path": r"^/api/", "rate": "100/m", "key": "ip"},
             {"path": r"^/login", "rate": "5/10s", "key": "user_or_ip",
              "algorithm": "sliding_window", "methods": ["POST"]}]
    with override_settings(REDIS_PATTERNS={"RATELIMIT": {"RULES": rules}}):
        assert checks.check_settings() == []


@pytest.mark.parametrize(("connection", "caches", "why"), [
    ("nope", None, "no such alias"),
    ("default", redis_cache("django.core.cache.backends.redis.RedisCache"), "django-redis"),
    ("default", {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": "x"}},
     "no Redis URL"),
    ("memcached://127.0.0.1:11211", None, "unsupported URL scheme"),
])
def test_unusable_connection_is_an_error(connection: str, caches: Any, why: str) -> None:
    extra = {"CACHES": caches} if caches else {}
    with override_settings(REDIS_PATTERNS={"CONNECTION": connection}, **extra):
        messages = checks.check_settings()
    assert ids(messages) == ["redispatterns.E004"]
    assert why in messages[0].msg


def test_a_feature_connection_is_checked_too() -> None:
    with override_settings(REDIS_PATTERNS={"LOCKS": {"CONNECTION": "missing"}}):
        messages = checks.check_settings()
    assert ids(messages) == ["redispatterns.E004"]
    assert messages[0].msg.startswith(
        "The LOCKS connection 'missing' cannot be used: no such alias in CACHES")


@pytest.mark.parametrize("connection", [
    "default", UNREACHABLE, "unix:///tmp/redis.sock?db=0", "rediss://h:6380/0",
    "redis+sentinel://h:26379/mymaster/0", "redis+cluster://h:7000,h:7001",
])
def test_good_connections_are_quiet(connection: str) -> None:
    with override_settings(REDIS_PATTERNS={"CONNECTION": connection}):
        assert checks.check_settings() == []


def test_cluster_url_with_a_database_is_an_error() -> None:
    url = "redis+cluster://127.0.0.1:7000/2"
    with override_settings(REDIS_PATTERNS={"CONNECTION": url}):
        assert checks.check_settings() == [
            E010(obj="REDIS_PATTERNS", what=f"The connection {url!r}", db=2)]


# --- W002: pickling session serializer ---------------------------------------------------


class PickleSessionSerializer:
    def dumps(self, obj: Any) -> bytes:
        return pickle.dumps(obj)

    def loads(self, data: bytes) -> Any:
        return pickle.loads(data)


class InnocentlyNamedSerializer(PickleSessionSerializer):
    pass


@pytest.mark.parametrize("serializer", [
    f"{__name__}.PickleSessionSerializer",
    f"{__name__}.InnocentlyNamedSerializer",  # found by what it writes, not by its name
    "django.contrib.sessions.serializers.PickleSerializer",  # removed in Django 5.0
])
def test_our_sessions_with_a_pickling_serializer_warn(serializer: str) -> None:
    with override_settings(SESSION_ENGINE=OUR_ENGINE, SESSION_SERIALIZER=serializer):
        assert checks.check_session_serializer() == [
            W002(obj="SESSION_SERIALIZER", engine=OUR_ENGINE, serializer=serializer)]


def test_json_sessions_and_other_engines_are_quiet() -> None:
    with override_settings(SESSION_ENGINE=OUR_ENGINE,
                           SESSION_SERIALIZER="django.core.signing.JSONSerializer"):
        assert checks.check_session_serializer() == []
    with override_settings(SESSION_ENGINE="django.contrib.sessions.backends.db",
                           SESSION_SERIALIZER=f"{__name__}.PickleSessionSerializer"):
        assert checks.check_session_serializer() == []


# --- W004, E008, E009, W003: middleware order-----------------------------------------------


class ProjectAuthMiddleware(AuthenticationMiddleware):
    """A project's own subclass still provides request.user."""


def order(*middleware: str, **extra: Any) -> list[str]:
    with override_settings(MIDDLEWARE=list(middleware), **extra):
        return ids(checks.check_middleware_order())


CSRF = "django.middleware.csrf.CsrfViewMiddleware"


def test_idempotency_before_csrf_warns() -> None:
    with override_settings(MIDDLEWARE=[SESSION, IDEM, CSRF, AUTH]):
        assert checks.check_middleware_order() == [
            W004(obj="MIDDLEWARE", blocker="CsrfViewMiddleware")]
    # The submodule path is the same class.
    assert order(SESSION, "django_redispatterns.middleware.idempotency.IdempotencyMiddleware",
                 CSRF) == ["redispatterns.W004"]
    assert order(SESSION, CSRF, AUTH, IDEM) == []


def test_idempotency_may_sit_before_sessions_and_authentication() -> None:
    # It decides in process_view, after every request phase: user and session exist there.
    assert order(IDEM, SESSION, AUTH) == []
    assert order(IDEM) == []


USER_RULES = {"RATELIMIT": {"RULES": [{"path": "^/api/", "rate": "5/m", "key": "user"}]}}


def test_user_keyed_rate_limits_need_authentication_first() -> None:
    with override_settings(MIDDLEWARE=[SESSION, LIMIT, AUTH], REDIS_PATTERNS=USER_RULES):
        assert checks.check_middleware_order() == [
            E008(obj="MIDDLEWARE", rules="#0 '^/api/'", where="before AuthenticationMiddleware")]
    assert order(LIMIT, REDIS_PATTERNS=USER_RULES) == ["redispatterns.E008"]
    assert order(SESSION, AUTH, LIMIT, REDIS_PATTERNS=USER_RULES) == []
    assert order(SESSION, f"{__name__}.ProjectAuthMiddleware", LIMIT,
                 REDIS_PATTERNS=USER_RULES) == []  # a subclass provides request.user too
    assert order(SESSION, LIMIT, f"{__name__}.ProjectAuthMiddleware",
                 REDIS_PATTERNS=USER_RULES) == ["redispatterns.E008"]
    ip_rules = {"RATELIMIT": {"RULES": [{"path": "^/api/", "rate": "5/m", "key": "ip"}]}}
    assert order(LIMIT, SESSION, AUTH, REDIS_PATTERNS=ip_rules) == []


def test_session_activity_needs_sessions_and_our_engine() -> None:
    with override_settings(MIDDLEWARE=[ACTIVITY, AUTH], SESSION_ENGINE=OUR_ENGINE):
        assert checks.check_middleware_order() == [E009(obj="MIDDLEWARE")]
    # Above SessionMiddleware (recommended) or below it: both keep the 503 guarantee.
    assert order(ACTIVITY, SESSION, AUTH, SESSION_ENGINE=OUR_ENGINE) == []
    assert order(SESSION, ACTIVITY, AUTH, SESSION_ENGINE=OUR_ENGINE) == []
    db_engine = "django.contrib.sessions.backends.db"
    with override_settings(MIDDLEWARE=[ACTIVITY, SESSION], SESSION_ENGINE=db_engine):
        assert checks.check_middleware_order() == [W003(obj="MIDDLEWARE", engine=db_engine)]


def test_unimportable_middleware_does_not_crash_the_check() -> None:
    assert order("no.such.Middleware", SESSION, AUTH, IDEM) == []


# --- through Django's framework ---------------------------------------------------------


def test_checks_are_registered_and_silenceable() -> None:
    # A shared Redis you cannot change: silence by id (bullmq #2737, cachalot #67).
    with override_settings(CACHES=redis_cache("django_redis.cache.RedisCache", TIMEOUT=None)):
        assert "redispatterns.E001" in ids(django_checks.run_checks(tags=["redispatterns"]))
        with override_settings(SILENCED_SYSTEM_CHECKS=["redispatterns.E001"]):
            messages = django_checks.run_checks(tags=["redispatterns"])
            assert [m for m in messages if not m.is_silenced()] == []


def test_static_checks_never_touch_the_network(redis_server_factory: Any) -> None:
    server = redis_server_factory()
    server.pause()  # any network call would hang until its timeout
    caches = {"default": {"BACKEND": "django_redis.cache.RedisCache", "LOCATION": server.url}}
    started = time.monotonic()
    with override_settings(CACHES=caches, SESSION_ENGINE=OUR_ENGINE,
                           REDIS_PATTERNS={"LOCKS": {"TTL": 10}}):
        messages = django_checks.run_checks(tags=["redispatterns"])
    assert time.monotonic() - started < 1.5  # a network call would hang far longer
    assert messages == []


def test_manage_py_check_reports_the_error(capsys: pytest.CaptureFixture[str]) -> None:
    from django.core.management.base import SystemCheckError

    with (override_settings(CACHES=redis_cache("django_redis.cache.RedisCache", TIMEOUT=None)),
          pytest.raises(SystemCheckError, match=r"redispatterns\.E001")):
        call_command("check")


# --- W017: django-redis's own Sentinel factory does not follow a graceful failover ----------


def sentinel_cache(factory: str | None) -> dict[str, Any]:
    options: dict[str, Any] = {"CLIENT_CLASS": "django_redis.client.SentinelClient",
                               "SENTINELS": [("127.0.0.1", 26379)]}
    if factory:
        options["CONNECTION_FACTORY"] = factory
    return {"default": {"BACKEND": "django_redis.cache.RedisCache",
                        "LOCATION": "redis://mymaster/0", "OPTIONS": options}}


def test_django_redis_sentinel_factory_warns_and_ours_is_quiet() -> None:
    plain = "django_redis.pool.SentinelConnectionFactory"
    with override_settings(CACHES=sentinel_cache(plain)):
        assert checks.check_cache_sentinel_factories() == [
            checks.W017(obj="CACHES['default']", alias="default", factory=plain)]
    with override_settings(CACHES=sentinel_cache(None),
                           DJANGO_REDIS_CONNECTION_FACTORY=plain):
        assert ids(checks.check_cache_sentinel_factories()) == ["redispatterns.W017"]
    ours = "django_redispatterns.connection.SentinelConnectionFactory"
    with override_settings(CACHES=sentinel_cache(ours)):
        assert checks.check_cache_sentinel_factories() == []


# --- W019: a KEY_FUNCTION that drops the prefix or the version -----------------------------


def key_without_prefix(key: str, key_prefix: str, version: int) -> str:
    return f"{version}:{key}"


def key_without_version(key: str, key_prefix: str, version: int) -> str:
    return f"{key_prefix}:{key}"


def key_with_both(key: str, key_prefix: str, version: int) -> str:
    return f"v{version}|{key_prefix}|{key}"


@pytest.mark.parametrize(("function", "dropped"), [
    (f"{__name__}.key_without_prefix", "prefix"),
    (f"{__name__}.key_without_version", "version"),
    (lambda key, key_prefix, version: key, "prefix and version"),
])
def test_a_key_function_that_drops_the_prefix_or_version_warns(function: Any,
                                                               dropped: str) -> None:
    caches = redis_cache("django_redispatterns.cache.RedisCache", KEY_PREFIX="app",
                         KEY_FUNCTION=function)
    with override_settings(CACHES=caches):
        (message,) = checks.check_cache_key_functions()
    assert message.id == "redispatterns.W019" and f"drops the key {dropped}" in message.msg


def key_with_prefix_last(key: str, key_prefix: str, version: int) -> str:
    return f"{key}:{version}:{key_prefix}"


def test_a_key_function_that_clear_cannot_scope_warns_on_our_backend() -> None:
    # Prefix and version are there, but not at a fixed beginning: clear() refuses it.
    ours = redis_cache("django_redispatterns.cache.RedisCache", KEY_PREFIX="app",
                       KEY_FUNCTION=f"{__name__}.key_with_prefix_last")
    with override_settings(CACHES=ours):
        (message,) = checks.check_cache_key_functions()
    assert message.id == "redispatterns.W019" and "clear() cannot prove" in message.msg
    # django-redis's own backend clears with FLUSHDB; CLEAR_FLUSHDB on ours likewise.
    plain = redis_cache("django_redis.cache.RedisCache", KEY_PREFIX="app",
                        KEY_FUNCTION=f"{__name__}.key_with_prefix_last")
    flushing = redis_cache("django_redispatterns.cache.RedisCache", KEY_PREFIX="app",
                           KEY_FUNCTION=f"{__name__}.key_with_prefix_last",
                           OPTIONS={"CLEAR_FLUSHDB": True})
    for caches in (plain, flushing):
        with override_settings(CACHES=caches):
            assert checks.check_cache_key_functions() == []


def test_key_functions_that_keep_both_are_quiet() -> None:
    for function in (f"{__name__}.key_with_both", None):
        extra = {"KEY_FUNCTION": function} if function else {}
        with override_settings(CACHES=redis_cache("django_redis.cache.RedisCache", **extra)):
            assert checks.check_cache_key_functions() == []


# --- passwords never printed --------------------------------------------------------------


def test_connection_errors_name_the_url_without_its_password() -> None:
    url = "memcached://admin:hunter2@127.0.0.1:11211"
    with override_settings(REDIS_PATTERNS={"CONNECTION": url}):
        (message,) = checks.check_settings()
    assert "hunter2" not in message.msg and "admin:***@" in message.msg
    cluster = "redis+cluster://:hunter2@127.0.0.1:7000/2"
    with override_settings(REDIS_PATTERNS={"CONNECTION": cluster}):
        (message,) = checks.check_settings()
    assert message.id == "redispatterns.E010" and "hunter2" not in message.msg
