"""What the project's settings say: Redis caches, connections, middleware positions.

Pure reading of ``django.conf.settings``; no network. Shared by the static checks and the
deploy checks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any
from urllib.parse import parse_qs, urlsplit

from django.conf import settings
from django.core.checks import CheckMessage
from django.utils.module_loading import import_string

from ..conf import SETTING_NAME, Config, build_config
from ..connection.cacheoptions import entry_urls
from ..exceptions import ConfigurationError
from .messages import E002

DJANGO_CACHE_SESSION_ENGINES = (
    "django.contrib.sessions.backends.cache",
    "django.contrib.sessions.backends.cached_db",
)
# Backends whose client can be shared through django_redis.get_redis_connection ...
DJANGO_REDIS_BACKENDS = ("django_redispatterns.cache.RedisCache", "django_redis.cache.RedisCache")
# ... and every Redis cache backend (Django's own keeps its client to itself).
REDIS_CACHE_BACKENDS = (*DJANGO_REDIS_BACKENDS, "django.core.cache.backends.redis.RedisCache")


def load_config() -> tuple[Config | None, list[CheckMessage]]:
    try:
        return build_config(getattr(settings, SETTING_NAME, {})), []
    except ConfigurationError as exc:
        return None, [E002(error=str(exc), setting=SETTING_NAME)]


def is_redis_backend(backend: str) -> bool:
    """True for Redis cache backends: django-redis, Django's own, ours, or a subclass."""
    return backend in REDIS_CACHE_BACKENDS or subclass_of(
        backend, "django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")


def is_django_redis(backend: str) -> bool:
    """True for backends whose client ``django_redis.get_redis_connection`` can share."""
    return backend in DJANGO_REDIS_BACKENDS or subclass_of(
        backend, "django_redis.cache.RedisCache")


def subclass_of(path: str, *bases: str) -> bool:
    cls = resolve(path)  # unimportable: Django's own checks report it
    return cls is not None and issubclass(cls, tuple(import_string(b) for b in bases))


def pickles(serializer: Any, make: Callable[[type], Any]) -> bool:
    """True when ``serializer`` (a dotted path or a class) writes pickle, judged by its
    name and by what an instance (``make(cls)``) writes for a small dict."""
    if isinstance(serializer, str) and "pickle" in serializer.lower():
        return True
    try:
        cls = import_string(serializer) if isinstance(serializer, str) else serializer
        data = make(cls).dumps({"probe": 1})
    except Exception:  # an unimportable serializer fails loudly on first use anyway
        return False
    # Pickle protocols >= 2 start with the PROTO opcode.
    return isinstance(data, (bytes, bytearray)) and data[:1] == b"\x80"


def redis_caches() -> dict[str, Mapping[str, Any]]:
    caches = getattr(settings, "CACHES", {}) or {}
    return {
        alias: entry for alias, entry in caches.items()
        if isinstance(entry, Mapping) and is_redis_backend(str(entry.get("BACKEND", "")))
    }


def features_and_connections(config: Config) -> dict[str, str]:
    names = {"top-level": None, "LOCKS": "LOCKS", "RATELIMIT": "RATELIMIT",
             "IDEMPOTENCY": "IDEMPOTENCY", "SESSIONS": "SESSIONS"}
    return {label: config.connection_for(feature) for label, feature in names.items()}


def connection_problem(connection: str) -> str | None:
    """Why ``connection`` (a CACHES alias or URL) cannot work, or None."""
    if "://" in connection:
        scheme = urlsplit(connection).scheme
        if scheme not in ("redis", "rediss", "unix", "redis+sentinel", "redis+cluster",
                          "rediss+sentinel", "rediss+cluster"):
            return f"unsupported URL scheme {scheme!r}"
        return None
    caches = getattr(settings, "CACHES", {}) or {}
    if connection not in caches:
        return f"no such alias in CACHES (aliases: {', '.join(sorted(caches)) or 'none'})"
    entry = caches[connection]
    backend = str(entry.get("BACKEND", ""))
    if not is_django_redis(backend):
        return (f"CACHES[{connection!r}] uses {backend!r}; only django-redis based backends "
                "share their client")
    if cache_url(entry) is None:
        return f"CACHES[{connection!r}] has no Redis URL in LOCATION"
    return None


def cache_url(entry: Mapping[str, Any]) -> str | None:
    """The Redis URL of a CACHES entry (the first of a LOCATION list), or None. It names
    the database the entry really uses (``OPTIONS["db"]`` and the like folded in)."""
    location: Any
    try:
        location = next(iter(entry_urls(entry)), None)
    except ConfigurationError:  # reported by the cache options check
        location = entry.get("LOCATION")
        if isinstance(location, (list, tuple)):
            location = location[0] if location else None
    if not isinstance(location, str) or "://" not in location:
        return None
    return location


def cache_sentinels(entry: Mapping[str, Any]) -> list[tuple[Any, ...]]:
    return [tuple(s) for s in (entry.get("OPTIONS") or {}).get("SENTINELS") or []]



def url_db(url: str) -> int:
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "db" in query:
        return int(query["db"][-1])
    segments = [p for p in parts.path.split("/") if p]
    if parts.scheme == "unix" or not segments:
        return 0
    if parts.scheme in ("redis+sentinel", "rediss+sentinel"):
        return int(segments[1]) if len(segments) > 1 and segments[1].isdigit() else 0
    return int(segments[0]) if segments[0].isdigit() else 0


# --- middleware positions ---------------------------------------------------------------

AUTH_MIDDLEWARE = "django.contrib.auth.middleware.AuthenticationMiddleware"
SESSION_MIDDLEWARE = "django.contrib.sessions.middleware.SessionMiddleware"
CSRF_MIDDLEWARE = "django.middleware.csrf.CsrfViewMiddleware"


def _ours(name: str) -> tuple[str, str]:
    module = {"RateLimitMiddleware": "ratelimit", "IdempotencyMiddleware": "idempotency",
              "SessionActivityMiddleware": "sessions"}[name]
    return (f"django_redispatterns.middleware.{name}",
            f"django_redispatterns.middleware.{module}.{name}")


def resolve(path: str) -> type | None:
    try:
        cls = import_string(path)
    except Exception:  # Django reports broken entries itself when it loads them
        return None
    return cls if isinstance(cls, type) else None


def position(middleware: Sequence[str], target: str, *, ours: bool) -> int | None:
    """Index of the first entry that is ``target`` or a subclass of it."""
    paths = _ours(target) if ours else (target,)
    name = target.rsplit(".", 1)[-1]
    for index, path in enumerate(middleware):
        if path in paths:
            return index
        cls = resolve(path)
        if cls is None:
            continue
        for base in cls.__mro__:
            qualified = f"{base.__module__}.{base.__qualname__}"
            if qualified in paths or (ours and base.__qualname__ == name
                                      and base.__module__.startswith("django_redispatterns.")):
                return index
    return None


