"""Django-style cache ``OPTIONS`` (``db``, ``socket_timeout``, ``pool_class``, ...) in
django-redis's terms, and the databases a ``CACHES`` entry really uses.

Django's own Redis backend passes its lowercase ``OPTIONS`` to redis-py's connection pool;
django-redis reads uppercase ones and ignores the rest. :func:`translate` (used by
``django_redispatterns.cache.RedisCache``) maps each Django-style option to django-redis's
equivalent, so it is applied, never ignored:

* ``db`` goes into every ``LOCATION`` URL (``redis://host:6379`` becomes
  ``redis://host:6379/5``): django-redis's pools, the cache's asyncio clients, the
  features that share the alias and the checks then all use that database. A URL that
  names another database is a :class:`ConfigurationError` (redis-py would silently prefer
  the URL's);
* ``socket_timeout``, ``socket_connect_timeout``, ``password``, ``username``,
  ``pool_class`` and ``parser_class`` become ``SOCKET_TIMEOUT``, ``SOCKET_CONNECT_TIMEOUT``,
  ``PASSWORD``, ``USERNAME``, ``CONNECTION_POOL_CLASS`` and ``PARSER_CLASS``;
* ``serializer`` (Django's ``dumps``/``loads`` serializer) is wrapped as django-redis's
  ``SERIALIZER``;
* every other keyword redis-py's connection pools and connections take (``max_connections``,
  ``retry_on_timeout``, ``health_check_interval``, ``ssl_*``, ...) goes to
  ``CONNECTION_POOL_KWARGS``.

Options nobody reads are left alone here; the system checks refuse them by name.
:func:`entry_urls` says which URLs (database included) any Redis ``CACHES`` entry uses:
ours, django-redis's or Django's own.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import parse_qs, urlsplit

from ..exceptions import ConfigurationError
from .urls import CLUSTER_SCHEME, SENTINEL_SCHEME, plain_scheme, redact

# Every option django-redis (5.4 to 7) reads from a cache's OPTIONS.
DJANGO_REDIS_OPTIONS = frozenset({
    "CLIENT_CLASS", "CLOSE_CONNECTION", "COMPRESSOR", "CONNECTION_FACTORY",
    "CONNECTION_POOL_CLASS", "CONNECTION_POOL_KWARGS", "IGNORE_EXCEPTIONS", "PARSER_CLASS",
    "PASSWORD", "PICKLE_VERSION", "REDIS_CLIENT_CLASS", "REDIS_CLIENT_KWARGS",
    "REPLICA_READ_ONLY", "SENTINELS", "SENTINEL_KWARGS", "SERIALIZER",
    "SOCKET_CONNECT_TIMEOUT", "SOCKET_TIMEOUT", "USERNAME",
})
RENAMED = {
    "socket_timeout": "SOCKET_TIMEOUT", "socket_connect_timeout": "SOCKET_CONNECT_TIMEOUT",
    "password": "PASSWORD", "username": "USERNAME", "pool_class": "CONNECTION_POOL_CLASS",
    "parser_class": "PARSER_CLASS",
}
# Pool keywords that cannot work here, and why.
REFUSED = {
    "decode_responses": "the cache stores bytes (pickled, compressed); decoded replies "
                        "break every read",
    "host": "the host comes from LOCATION", "port": "the port comes from LOCATION",
    "path": "a socket path comes from LOCATION (unix://)",
}
DJANGO_SERIALIZER_ADAPTER = "django_redispatterns.cache.compat.DjangoSerializer"
DJANGO_SERIALIZER_OPTION = "_DJANGO_SERIALIZER"  # where the adapter finds Django's serializer
DJANGO_BACKEND = "django.core.cache.backends.redis.RedisCache"


@functools.cache
def pool_keywords() -> frozenset[str]:
    """The keywords the installed redis-py's pools and connections accept (what Django's
    backend passes through from its OPTIONS)."""
    import redis.connection as rc

    names: set[str] = set()
    classes = [rc.ConnectionPool, rc.BlockingConnectionPool, rc.Connection,
               rc.SSLConnection, rc.UnixDomainSocketConnection,
               getattr(rc, "AbstractConnection", rc.Connection)]
    for cls in classes:
        for param in inspect.signature(cls.__init__).parameters.values():
            if param.kind in (param.POSITIONAL_OR_KEYWORD, param.KEYWORD_ONLY):
                names.add(param.name)
    return frozenset(names - {"self", "connection_kwargs"} - set(REFUSED))


def known(name: str, own: frozenset[str] = frozenset()) -> bool:
    """True for an option django-redis, :func:`translate` or ``own`` (the backend's own
    options) gives a meaning."""
    return (name in DJANGO_REDIS_OPTIONS or name in own or name in RENAMED or name == "db"
            or name == "serializer" or name in pool_keywords())


def translate(location: Any, options: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """``(location, options)`` with every Django-style option in django-redis's form (see
    the module docstring). Raises :class:`ConfigurationError` for a refused option, or a
    Django-style option that contradicts its django-redis twin or the URL."""
    opts = dict(options)
    pool_kwargs = dict(opts.get("CONNECTION_POOL_KWARGS") or {})
    for name, why in REFUSED.items():
        if name in opts:
            raise ConfigurationError(f"CACHES OPTIONS[{name!r}] cannot be used: {why}.")
    db = _db(opts.pop("db", None), pool_kwargs.pop("db", None))
    for lower, upper in RENAMED.items():
        if lower in opts:
            _put(opts, upper, _dotted(opts.pop(lower)), lower)
    if "serializer" in opts:
        _put(opts, "SERIALIZER", DJANGO_SERIALIZER_ADAPTER, "serializer")
        opts[DJANGO_SERIALIZER_OPTION] = opts.pop("serializer")
    for name in [n for n in opts if n in pool_keywords()]:
        _put(pool_kwargs, name, opts.pop(name), name)
    if pool_kwargs or "CONNECTION_POOL_KWARGS" in options:
        opts["CONNECTION_POOL_KWARGS"] = pool_kwargs
    if db is not None:
        location = _map_location(location, lambda url: with_db(url, db, strict=True))
    return location, opts


def entry_urls(entry: Mapping[str, Any]) -> list[str]:
    """The URLs a Redis ``CACHES`` entry connects to, each naming the database it uses.

    Our backend (a class with ``DJANGO_STYLE_OPTIONS``): as :func:`translate` maps them.
    Django's own backend: its ``OPTIONS["db"]``; django-redis's: its
    ``CONNECTION_POOL_KWARGS["db"]`` (for both, a database the URL names wins, as in
    redis-py). May raise :class:`ConfigurationError` (our backend, a contradiction)."""
    location = entry.get("LOCATION")
    options = entry.get("OPTIONS") or {}
    cls = _backend_class(str(entry.get("BACKEND", "")))
    if cls is not None and getattr(cls, "DJANGO_STYLE_OPTIONS", False):
        location = translate(location, options)[0]
        db = None
    elif cls is not None and _is_djangos(cls):
        location = re.split("[;,]", location) if isinstance(location, str) else location
        db = options.get("db")
    else:
        db = (options.get("CONNECTION_POOL_KWARGS") or {}).get("db")
    urls = [u for u in _urls(location) if "://" in u]
    return [with_db(u, int(db), strict=False) for u in urls] if db is not None else urls


def named_db(url: str) -> int | None:
    """The database ``url`` names (``?db=``, the path; 0 for Cluster), or None."""
    parts = urlsplit(url)
    query = parse_qs(parts.query)
    if "db" in query:
        return int(query["db"][-1])
    scheme = plain_scheme(parts.scheme)
    if scheme == CLUSTER_SCHEME:
        return 0
    segments = [p for p in parts.path.split("/") if p]
    if scheme == SENTINEL_SCHEME:
        segments = segments[1:]
    elif parts.scheme == "unix":
        return None
    return int(segments[0]) if segments and segments[0].isdigit() else None


def with_db(url: str, db: int, *, strict: bool) -> str:
    """``url`` on database ``db`` when it names none. When it names another: ``strict``
    raises :class:`ConfigurationError`, else ``url`` is kept (redis-py's precedence)."""
    named = named_db(url)
    if named is not None:
        if named != db and strict:
            only = (" (Redis Cluster has only database 0)"
                    if plain_scheme(url.split("://", 1)[0]) == CLUSTER_SCHEME else "")
            raise ConfigurationError(
                f"CACHES OPTIONS['db'] is {db} but LOCATION {redact(url)!r} names database "
                f"{named}{only}; keep one of the two.")
        return url
    base, _, query = url.partition("?")
    scheme = plain_scheme(url.split("://", 1)[0])
    if scheme in ("redis", "rediss") and urlsplit(base).path in ("", "/"):
        return f"{base.rstrip('/')}/{db}" + (f"?{query}" if query else "")
    if scheme == SENTINEL_SCHEME and len([p for p in urlsplit(base).path.split("/") if p]) == 1:
        return f"{base.rstrip('/')}/{db}" + (f"?{query}" if query else "")
    return f"{base}?{query + '&' if query else ''}db={db}"


def _db(option: Any, pool_kwarg: Any) -> int | None:
    values = {v for v in (option, pool_kwarg) if v is not None}
    if not values:
        return None
    if len(values) > 1:
        raise ConfigurationError(
            f"CACHES OPTIONS['db'] ({option!r}) and OPTIONS['CONNECTION_POOL_KWARGS']['db'] "
            f"({pool_kwarg!r}) disagree; keep one.")
    value = values.pop()
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ConfigurationError(f"CACHES OPTIONS['db'] must be an integer >= 0, got {value!r}.")
    return value


def _put(target: dict[str, Any], name: str, value: Any, given_as: str) -> None:
    if target.get(name) is not None and target[name] != value:  # None: not set
        raise ConfigurationError(
            f"CACHES OPTIONS[{given_as!r}] ({value!r}) contradicts {name} "
            f"({target[name]!r}); keep one.")
    target[name] = value


def _dotted(value: Any) -> Any:
    """A class as the dotted path django-redis imports (Django accepts either)."""
    if isinstance(value, type):
        return f"{value.__module__}.{value.__qualname__}"
    return value


def _urls(location: Any) -> list[str]:
    if isinstance(location, str):
        parts = location.split(",")
        return parts if all("://" in p for p in parts) else [location]
    return [str(u) for u in location or ()]


def _map_location(location: Any, change: Any) -> Any:
    urls = [change(u) for u in _urls(location)]
    return ",".join(urls) if isinstance(location, str) else type(location)(urls)


def _backend_class(path: str) -> type | None:
    from django.utils.module_loading import import_string

    try:
        cls = import_string(path)
    except ImportError:
        return None
    return cls if isinstance(cls, type) else None


def _is_djangos(cls: type) -> bool:
    from django.core.cache.backends.redis import RedisCache

    return issubclass(cls, RedisCache)
