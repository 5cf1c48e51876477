"""Cache checks: entries that never expire, keys that lose their prefix, a Sentinel
factory that does not follow a failover (static), a serializer that unpickles (deploy)."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.cache.backends.base import get_key_func
from django.core.checks import CheckMessage, Tags, register

from ..cache import key_scope_problem
from .messages import E001, TAG, W001, W017, W018, W019
from .project import pickles, redis_caches, subclass_of

DJANGO_REDIS_SENTINEL_FACTORY = "django_redis.pool.SentinelConnectionFactory"
OUR_SENTINEL_FACTORY = "django_redispatterns.connection.SentinelConnectionFactory"
OUR_CACHE_BACKEND = "django_redispatterns.cache.RedisCache"
# Probe values no real key function would invent.
_PROBE_PREFIX, _PROBE_VERSION = "rp-check-prefix", 736251


@register(TAG, Tags.caches)
def check_cache_ttls(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E001/W001: a Redis-backed cache whose entries never expire."""
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        if "TIMEOUT" in entry and entry["TIMEOUT"] is None:
            options = entry.get("OPTIONS") or {}
            allowed = options.get("ALLOW_NO_TTL") is True
            messages.append((W001 if allowed else E001)(obj=f"CACHES[{alias!r}]", alias=alias))
    return messages




@register(TAG, Tags.caches)
def check_cache_key_functions(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W019: a KEY_FUNCTION whose keys do not carry the prefix or the version, or (on this
    package's backend) whose keys ``clear()`` cannot prove are the cache's own."""
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        if not entry.get("KEY_FUNCTION"):
            continue
        try:
            key_func = get_key_func(entry["KEY_FUNCTION"])
            key = str(key_func("k", _PROBE_PREFIX, _PROBE_VERSION))
        except Exception:  # unimportable or broken: Django fails loudly on first use
            continue
        dropped = [what for what, probe in (("prefix", _PROBE_PREFIX),
                                            ("version", str(_PROBE_VERSION)))
                   if probe not in key]
        problem = f"drops the key {' and '.join(dropped)}" if dropped else None
        if problem is None and _scoped_clear(entry):
            why = key_scope_problem(key_func, str(entry.get("KEY_PREFIX", "")))
            if why is not None:
                problem = f"makes keys clear() cannot prove are this cache's own ({why})"
        if problem is not None:
            messages.append(W019(obj=f"CACHES[{alias!r}]", alias=alias, problem=problem))
    return messages


def _scoped_clear(entry: Mapping[str, Any]) -> bool:
    """True when the entry is this package's backend with a prefix-scoped clear()."""
    backend = entry.get("BACKEND")
    return (isinstance(backend, str) and subclass_of(backend, OUR_CACHE_BACKEND)
            and (entry.get("OPTIONS") or {}).get("CLEAR_FLUSHDB") is not True)


@register(TAG, Tags.caches)
def check_cache_sentinel_factories(app_configs: Any = None,
                                   **kwargs: Any) -> list[CheckMessage]:
    """W017: django-redis's own Sentinel factory (its clients miss a graceful failover)."""
    default = getattr(settings, "DJANGO_REDIS_CONNECTION_FACTORY", None)
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        factory = (entry.get("OPTIONS") or {}).get("CONNECTION_FACTORY") or default
        if not isinstance(factory, str) or factory == OUR_SENTINEL_FACTORY:
            continue
        if factory == DJANGO_REDIS_SENTINEL_FACTORY or (
                subclass_of(factory, DJANGO_REDIS_SENTINEL_FACTORY)
                and not subclass_of(factory, OUR_SENTINEL_FACTORY)):
            messages.append(W017(obj=f"CACHES[{alias!r}]", alias=alias, factory=factory))
    return messages


@register(TAG, Tags.caches, Tags.security, deploy=True)
def check_cache_serializers(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """W018: a Redis cache that unpickles what it reads (django-redis's and Django's
    default). A warning on deploy only: it is the default, and safe while nobody but the
    app can write to that Redis; the check says so once, where production is judged."""
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        options = entry.get("OPTIONS") or {}
        if str(entry.get("BACKEND")) == "django.core.cache.backends.redis.RedisCache" or (
                subclass_of(str(entry.get("BACKEND")),
                            "django.core.cache.backends.redis.RedisCache")):
            serializer = options.get("serializer") or (
                "django.core.cache.backends.redis.RedisSerializer")
            made = pickles(serializer, lambda cls: cls())
        else:
            serializer = options.get("SERIALIZER") or (
                "django_redis.serializers.pickle.PickleSerializer")
            made = pickles(serializer, functools.partial(_django_redis_serializer, options))
        if made:
            messages.append(W018(obj=f"CACHES[{alias!r}]", alias=alias,
                                 serializer=serializer))
    return messages


def _django_redis_serializer(options: dict[str, Any], cls: type) -> Any:
    return cls(options=dict(options))
