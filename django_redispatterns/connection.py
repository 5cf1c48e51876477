"""The one place that turns settings into Redis clients.

A feature asks for ``get_client("LOCKS")`` (or ``get_async_client`` in async code) and
gets a client for that feature's ``CONNECTION``:

* the alias of a django-redis ``CACHES`` entry: django-redis's own client and pool are
  reused (``django_redis.get_redis_connection``), so options such as Sentinel or Cluster
  client classes, passwords and pool sizes are configured once, in ``CACHES``;
* a URL: ``redis://``, ``rediss://``, ``unix://``, ``redis+sentinel://host:port[,host:port]
  /service[/db]`` or ``redis+cluster://host:port[,host:port]``.

Clients built from URLs use the top-level ``SOCKET_TIMEOUT``/``SOCKET_CONNECT_TIMEOUT``
and retry a command at most once, and only after a *connection* error (a stale pooled
socket after a server restart) — never after a timeout, because a timed-out Lua call
may already have run (SPEC D4).

``get_client(feature, resend=False)`` (and ``get_async_client``/``client_for``/
``async_client_for`` with ``resend=False``) gives a client that never re-sends a command,
not even after a connection error (a connection can break after the command was sent):
for features whose calls are not idempotent and carry no request id (SPEC D4's "retries
off" remedy). For a CACHES alias it is a second client over its own pool with the alias
pool's connection options, retries off; it is built once per process.

Cluster clients re-send nothing themselves (redis-py's ``RedisCluster`` would re-send a
timed-out command, pipelines included): they still follow ``MOVED``/``ASK`` and refresh the
slot map after a connection error, and :mod:`.scripts` retries, with bounded back-off,
only the calls the cluster *rejected before running them* (``TRYAGAIN`` during a slot
migration, ``CLUSTERDOWN`` during a failover). See ``docs/scale.md``.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from .conf import get_config
from .exceptions import ConfigurationError

SENTINEL_SCHEME = "redis+sentinel"
CLUSTER_SCHEME = "redis+cluster"

_lock = threading.Lock()
# Keyed by (connection, resend).
_clients: dict[tuple[str, bool], Any] = {}
_async_clients: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, bool], Any]] = weakref.WeakKeyDictionary()


def get_client(feature: str | None = None, *, resend: bool = True) -> Any:
    """A (sync) Redis client for ``feature``'s connection ("LOCKS", "RATELIMIT", ...).

    ``resend=False``: the client never sends a command twice (no retry after a timeout
    or a connection error), so a call that may have run is reported as failed instead.
    """
    return client_for(get_config().connection_for(feature), resend=resend)


def client_for(connection: str, *, resend: bool = True) -> Any:
    """A (sync) Redis client for a connection string: a CACHES alias or a URL.

    ``resend=False`` as in :func:`get_client`.
    """
    key = (connection, resend)
    client = _clients.get(key)
    if client is None:
        with _lock:
            client = _clients.get(key)
            if client is None:
                client = _build_sync(connection, resend)
                _clients[key] = client
    return client


def get_async_client(feature: str | None = None, *, resend: bool = True) -> Any:
    """An asyncio Redis client for ``feature``'s connection, bound to the running loop.

    ``resend=False`` as in :func:`get_client`.
    """
    return async_client_for(get_config().connection_for(feature), resend=resend)


def async_client_for(connection: str, *, resend: bool = True) -> Any:
    """An asyncio Redis client for a connection string (one per event loop)."""
    loop = asyncio.get_running_loop()
    per_loop = _async_clients.setdefault(loop, {})
    key = (connection, resend)
    client = per_loop.get(key)
    if client is None:
        client = per_loop[key] = _build_async(connection, resend)
    return client


def reset_clients() -> None:
    """Forget cached clients (settings changed). Their pools close when collected."""
    with _lock:
        _clients.clear()
    _async_clients.clear()


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (sync or asyncio)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


# --- building ---------------------------------------------------------------------------


def _is_url(connection: str) -> bool:
    return "://" in connection


def _cache_location(alias: str) -> str:
    from django.conf import settings

    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ConfigurationError(
            f"REDIS_PATTERNS connection {alias!r} is neither a URL nor an alias in CACHES "
            f"(aliases: {', '.join(sorted(caches)) or 'none'})."
        )
    location = caches[alias].get("LOCATION")
    if isinstance(location, (list, tuple)):
        location = location[0]
    if not isinstance(location, str) or not _is_url(location):
        raise ConfigurationError(
            f"CACHES[{alias!r}] has no Redis URL in LOCATION; REDIS_PATTERNS can only use "
            "a django-redis cache alias or a URL."
        )
    return location


def _build_sync(connection: str, resend: bool = True) -> Any:
    if not _is_url(connection):
        _cache_location(connection)  # validates the alias with a clear message
        from django_redis import get_redis_connection

        client = get_redis_connection(connection)
        return client if resend else _without_resend(client)
    return _from_url(connection, asyncio_client=False, resend=resend)


def _build_async(connection: str, resend: bool = True) -> Any:
    url = connection if _is_url(connection) else _cache_location(connection)
    if not _is_url(connection):
        url = _native_sentinel_url(connection, url)
    return _from_url(url, asyncio_client=True, resend=resend)


# Connection options that turn every re-send off, on redis-py 5 (which re-sends only the
# errors in ``retry_on_error``) as on 6+ (where ``retry`` alone decides).
def _no_resend_options(asyncio_client: bool) -> dict[str, Any]:
    if asyncio_client:
        from redis.asyncio.retry import Retry as AsyncRetry

        return {"retry": AsyncRetry(NoBackoff(), 0), "retry_on_error": [],
                "retry_on_timeout": False}
    return {"retry": Retry(NoBackoff(), 0), "retry_on_error": [], "retry_on_timeout": False}


def _without_resend(client: Any) -> Any:
    """A client like django-redis's ``client`` (same connection options, its own pool)
    that never re-sends a command. Cluster clients already never do (see :func:`_cluster`)."""
    if is_cluster(client):
        return client
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs.update(_no_resend_options(asyncio_client=False))
    kwargs["connection_class"] = pool.connection_class
    kwargs["max_connections"] = pool.max_connections
    new_pool: Any
    if isinstance(pool, SentinelConnectionPool):
        new_pool = SentinelConnectionPool(pool.service_name, pool.sentinel_manager,
                                          is_master=pool.is_master,
                                          check_connection=pool.check_connection, **kwargs)
    else:
        new_pool = type(pool)(**kwargs)
    return redis.Redis(connection_pool=new_pool)


def _native_sentinel_url(alias: str, location: str) -> str:
    """django-redis's own Sentinel set-up (``OPTIONS["SENTINELS"]`` + ``redis://service/db``)
    as our ``redis+sentinel://`` form, so asyncio clients find the primary too."""
    from django.conf import settings

    caches: dict[str, Any] = getattr(settings, "CACHES", {})
    sentinels = (caches[alias].get("OPTIONS") or {}).get("SENTINELS")
    if not sentinels:
        return location
    parts = urlsplit(location)
    hosts = ",".join(f"{host}:{port}" for host, port in sentinels)
    userinfo = parts.netloc.rsplit("@", 1)[0] + "@" if "@" in parts.netloc else ""
    db = parts.path.strip("/") or "0"
    return f"{SENTINEL_SCHEME}://{userinfo}{hosts}/{parts.hostname}/{db}"


def _timeouts() -> dict[str, Any]:
    config = get_config()
    return {
        "socket_timeout": config["SOCKET_TIMEOUT"],
        "socket_connect_timeout": config["SOCKET_CONNECT_TIMEOUT"],
    }


def _retry(asyncio_client: bool) -> Any:
    if asyncio_client:
        from redis.asyncio.retry import Retry as AsyncRetry

        return AsyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))
    return Retry(NoBackoff(), 1, supported_errors=(RedisConnectionError,))


def _hosts(netloc: str, default_port: int) -> list[tuple[str, int]]:
    hosts = []
    for part in netloc.rsplit("@", 1)[-1].split(","):
        host, _, port = part.rpartition(":") if ":" in part else (part, "", "")
        hosts.append((host or "127.0.0.1", int(port or default_port)))
    return hosts


def _credentials(netloc: str) -> dict[str, Any]:
    if "@" not in netloc:
        return {}
    userinfo = netloc.rsplit("@", 1)[0]
    user, _, password = userinfo.partition(":")
    creds: dict[str, Any] = {}
    if user:
        creds["username"] = unquote(user)
    if password:
        creds["password"] = unquote(password)
    return creds


def _from_url(url: str, *, asyncio_client: bool, timeouts: dict[str, Any] | None = None,
              resend: bool = True) -> Any:
    parts = urlsplit(url)
    # retry_on_error: redis-py 5 re-sends only these errors, whatever ``retry`` says.
    options = {**(timeouts or _timeouts()), "retry": _retry(asyncio_client),
               "retry_on_error": [RedisConnectionError], "retry_on_timeout": False}
    if not resend:
        options.update(_no_resend_options(asyncio_client))
    if parts.scheme == SENTINEL_SCHEME:
        return _sentinel_master(parts, options, asyncio_client)
    if parts.scheme == CLUSTER_SCHEME:
        return _cluster(parts, options, asyncio_client)
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(f"Unsupported Redis URL scheme {parts.scheme!r} in {url!r}.")
    module: Any = redis.asyncio if asyncio_client else redis
    return module.Redis.from_url(url, **options)


def _sentinel_master(parts: Any, options: dict[str, Any], asyncio_client: bool) -> Any:
    path = [p for p in parts.path.split("/") if p]
    if not path:
        raise ConfigurationError(
            "A redis+sentinel:// URL needs the service name: "
            "redis+sentinel://host:26379[,host:26379]/mymaster[/db]."
        )
    service = path[0]
    db = int(path[1]) if len(path) > 1 else 0
    query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
    creds = _credentials(parts.netloc)
    sentinel_kwargs = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    if "sentinel_password" in query:
        sentinel_kwargs["password"] = query["sentinel_password"]
    if asyncio_client:
        from redis.asyncio.sentinel import Sentinel as AsyncSentinel

        sentinel: Any = AsyncSentinel(_hosts(parts.netloc, 26379),
                                      sentinel_kwargs=sentinel_kwargs, **options)
    else:
        from redis.sentinel import Sentinel

        sentinel = Sentinel(_hosts(parts.netloc, 26379), sentinel_kwargs=sentinel_kwargs,
                            **options)
    return sentinel.master_for(service, db=db, **creds)


def _cluster(parts: Any, options: dict[str, Any], asyncio_client: bool) -> Any:
    if parts.path.strip("/") not in ("", "0"):
        raise ConfigurationError(
            f"Redis Cluster has only database 0; remove {parts.path!r} from the "
            "redis+cluster:// URL."
        )
    creds = _credentials(parts.netloc)
    # The cluster client's own retry loop would re-send a command after a TimeoutError
    # (and re-send whole pipelines), so it gets zero retries: a timed-out script may have
    # run (SPEC D4). Redirects (MOVED/ASK/TRYAGAIN) are not retries and are still followed.
    kwargs = {k: v for k, v in options.items()
              if k not in ("retry", "retry_on_error", "retry_on_timeout")}
    if redis.VERSION < (6,):  # before 6, this count (not ``retry``) drives cluster re-sends
        # redis-py 5's asyncio pipeline makes range(count) attempts, so it needs 1 (which
        # lets a single asyncio command be re-sent once there; scripts are D4-safe).
        kwargs["cluster_error_retry_attempts"] = 1 if asyncio_client else 0
    if asyncio_client:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.asyncio.retry import Retry as AsyncRetry

        class _AsyncCluster(AsyncRedisCluster):
            async def mget(self, keys: Any, *args: Any) -> Any:  # see _SyncCluster
                return await self.mget_nonatomic(keys, *args)

        nodes: list[Any] = [AsyncNode(h, p) for h, p in _hosts(parts.netloc, 6379)]
        return _AsyncCluster(startup_nodes=nodes, retry=AsyncRetry(NoBackoff(), 0),
                             **creds, **kwargs)
    from redis.cluster import ClusterNode

    nodes = [ClusterNode(h, p) for h, p in _hosts(parts.netloc, 6379)]
    return _SyncCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **creds, **kwargs)


class _SyncCluster(RedisCluster):
    """``RedisCluster`` whose ``MGET`` accepts keys of several slots (one ``MGET`` per
    slot, not atomic across slots), as Django's ``cache.get_many()`` needs."""

    def mget(self, keys: Any, *args: Any) -> Any:
        return self.mget_nonatomic(keys, *args)


# --- django-redis -------------------------------------------------------------------------


class ConnectionFactory:
    """A django-redis ``CONNECTION_FACTORY`` that also understands ``redis+cluster://`` and
    ``redis+sentinel://`` locations (see ``docs/scale.md``)::

        CACHES = {"default": {
            "BACKEND": "django_redispatterns.cache.RedisCache",
            # a list, so that django-redis does not split the URL at its commas
            "LOCATION": ["redis+cluster://10.0.0.1:6379,10.0.0.2:6379"],
            "OPTIONS": {"CONNECTION_FACTORY": "django_redispatterns.connection.ConnectionFactory",
                        "SOCKET_TIMEOUT": 1, "SOCKET_CONNECT_TIMEOUT": 1},
        }}

    Plain ``redis://``/``rediss://``/``unix://`` locations go to django-redis's own
    factory (pools, parser and every option unchanged). Cluster and Sentinel clients are
    built like the ones ``REDIS_PATTERNS`` URLs give (no re-send after a timeout, SPEC D4)
    and shared per process and location; ``SOCKET_TIMEOUT``/``SOCKET_CONNECT_TIMEOUT``
    come from the cache's ``OPTIONS``, else from ``REDIS_PATTERNS``.
    """

    _shared: dict[tuple[Any, ...], Any] = {}
    # Not the module's _lock: client_for() holds that one while django-redis calls us.
    _shared_lock = threading.Lock()

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def connect(self, url: str) -> Any:
        scheme = urlsplit(url).scheme
        if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
            from django_redis.pool import ConnectionFactory as DjangoRedisFactory

            return DjangoRedisFactory(self.options).connect(url)
        timeouts = _timeouts()
        for option, name in (("SOCKET_TIMEOUT", "socket_timeout"),
                             ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout")):
            if self.options.get(option) is not None:
                timeouts[name] = self.options[option]
        key = (url, tuple(sorted(timeouts.items())))
        client = self._shared.get(key)
        if client is None:
            with self._shared_lock:
                client = self._shared.get(key)
                if client is None:
                    client = self._shared[key] = _from_url(url, asyncio_client=False,
                                                           timeouts=timeouts)
        return client

    def disconnect(self, connection: Any) -> None:
        """Called by django-redis's ``close()`` (``CLOSE_CONNECTION``): shared Cluster and
        Sentinel clients stay open; plain clients drop their pooled sockets."""
        if not is_cluster(connection) and connection not in self._shared.values():
            connection.connection_pool.disconnect()
