"""Cache checks: entries that never expire, keys that lose their prefix, a Sentinel
factory that does not follow a failover (static), a serializer that unpickles (deploy)."""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Mapping
from typing import Any

from django.conf import settings
from django.core.cache.backends.base import get_key_func
from django.core.checks import CheckMessage, Tags, register

from ..cache import key_scope_problem
from ..connection.cacheoptions import DJANGO_REDIS_OPTIONS, known, translate
from ..exceptions import ConfigurationError
from .messages import E001, E012, E013, TAG, W001, W017, W018, W019, W020
from .project import pickles, redis_caches, resolve, subclass_of

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


# Options naming a class; one outside these packages may read options of its own.
_CLASS_OPTIONS = ("CLIENT_CLASS", "SERIALIZER", "COMPRESSOR", "CONNECTION_FACTORY",
                  "REDIS_CLIENT_CLASS", "CONNECTION_POOL_CLASS", "PARSER_CLASS",
                  "pool_class", "parser_class", "serializer")
_OURS_OR_LIBRARIES = ("django_redis.", "django_redispatterns.", "redis.", "django.")


@register(TAG, Tags.caches)
def check_cache_options(app_configs: Any = None, **kwargs: Any) -> list[CheckMessage]:
    """E012/W020: an OPTIONS key the backend does not read (it would be ignored);
    E013: Django-style options that contradict each other or the URL."""
    messages: list[CheckMessage] = []
    for alias, entry in redis_caches().items():
        backend = str(entry.get("BACKEND"))
        cls = resolve(backend)
        if cls is None or not subclass_of(backend, "django_redis.cache.RedisCache"):
            continue  # Django's own backend passes its options to redis-py, which refuses
        options = entry.get("OPTIONS") or {}
        obj = f"CACHES[{alias!r}]"
        ours = getattr(cls, "DJANGO_STYLE_OPTIONS", False)
        if ours:
            try:
                translate(entry.get("LOCATION"), options)
            except ConfigurationError as exc:
                messages.append(E013(obj=obj, alias=alias, error=str(exc)))
        own: frozenset[str] = getattr(cls, "OWN_OPTIONS", frozenset())
        custom = [f"{name} ({value})" for name in _CLASS_OPTIONS
                  if isinstance(value := _path(options.get(name)), str)
                  and not value.startswith(_OURS_OR_LIBRARIES)]
        for option in options:
            if (known(option, own) if ours else option in DJANGO_REDIS_OPTIONS | own):
                continue
            fields = {"alias": alias, "option": option, "backend": backend}
            messages.append(W020(obj=obj, custom=", ".join(custom), **fields) if custom
                            else E012(obj=obj, **fields))
    return messages


def _path(value: Any) -> Any:
    return f"{value.__module__}.{value.__qualname__}" if isinstance(value, type) else value


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
            if getattr(resolve(str(entry.get("BACKEND"))), "DJANGO_STYLE_OPTIONS", False):
                # OPTIONS["serializer"] (Django's style) as the backend reads it; E013
                # reports options it cannot read
                with contextlib.suppress(ConfigurationError):
                    options = translate(entry.get("LOCATION"), options)[1]
            serializer = options.get("SERIALIZER") or (
                "django_redis.serializers.pickle.PickleSerializer")
            made = pickles(serializer, functools.partial(_django_redis_serializer, options))
        if made:
            messages.append(W018(obj=f"CACHES[{alias!r}]", alias=alias,
                                 serializer=serializer))
    return messages


def _django_redis_serializer(options: dict[str, Any], cls: type) -> Any:
    return cls(options=dict(options))
