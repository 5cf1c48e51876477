"""Building redis-py clients from a CACHES alias or a URL (see the package docstring)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.retry import Retry

from ..conf import get_config
from ..exceptions import ConfigurationError
from . import sentinel
from .cacheoptions import entry_urls
from .clusterpipe import aunknown_redirect, pipeline_without_resend, unknown_redirect
from .tls import asyncio_cluster_takes_key_password, ssl_options
from .transport import report_closed_transports
from .urls import CLUSTER_SCHEME, SENTINEL_SCHEME, ParsedURL, parse_url, redact


def is_cluster(client: Any) -> bool:
    """True for a Redis Cluster client (sync or asyncio)."""
    from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster

    return isinstance(client, (RedisCluster, AsyncRedisCluster))


def is_url(connection: str) -> bool:
    return "://" in connection


def cache_location(alias: str) -> str:
    from django.conf import settings

    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ConfigurationError(
            f"REDIS_PATTERNS connection {alias!r} is neither a URL nor an alias in CACHES "
            f"(aliases: {', '.join(sorted(caches)) or 'none'})."
        )
    urls = entry_urls(caches[alias])  # the database Django-style OPTIONS["db"] names, too
    location = urls[0] if urls else None
    if not isinstance(location, str) or not is_url(location):
        raise ConfigurationError(
            f"CACHES[{alias!r}] has no Redis URL in LOCATION; REDIS_PATTERNS can only use "
            "a django-redis cache alias or a URL."
        )
    return location


def build_sync(connection: str, resend: bool = True) -> Any:
    if not is_url(connection):
        cache_location(connection)  # validates the alias with a clear message
        from django_redis import get_redis_connection

        client = get_redis_connection(connection)
        return client if resend else without_resend(client)
    return from_url(connection, asyncio_client=False, resend=resend)


def build_async(connection: str, resend: bool = True) -> Any:
    url = connection if is_url(connection) else cache_location(connection)
    if not is_url(connection):
        url = native_sentinel_url(connection, url)
    return from_url(url, asyncio_client=True, resend=resend)


# Connection options that turn every re-send off, on redis-py 5 (which re-sends only the
# errors in ``retry_on_error``) as on 6+ (where ``retry`` alone decides).
def no_resend_options(asyncio_client: bool) -> dict[str, Any]:
    if asyncio_client:
        from redis.asyncio.retry import Retry as AsyncRetry

        return {"retry": AsyncRetry(NoBackoff(), 0), "retry_on_error": [],
                "retry_on_timeout": False}
    return {"retry": Retry(NoBackoff(), 0), "retry_on_error": [], "retry_on_timeout": False}


def without_resend(client: Any) -> Any:
    """A client like django-redis's ``client`` (same connection options, its own pool)
    that never re-sends a command. Cluster clients already never do (see :func:`cluster`)."""
    if is_cluster(client):
        return client
    from redis.sentinel import SentinelConnectionPool

    pool = client.connection_pool
    kwargs = {k: v for k, v in pool.connection_kwargs.items() if k != "connection_pool"}
    kwargs.update(no_resend_options(asyncio_client=False))
    kwargs["connection_class"] = pool.connection_class
    kwargs["max_connections"] = pool.max_connections
    new_pool: Any
    if isinstance(pool, SentinelConnectionPool):
        # Ours follows a failover when the alias's does (django-redis's own Sentinel pool
        # does not: see the SentinelConnectionFactory).
        pool_class = (sentinel.FollowingPool if isinstance(pool, sentinel.FollowingPool)
                      else SentinelConnectionPool)
        new_pool = pool_class(pool.service_name, pool.sentinel_manager,
                              is_master=pool.is_master,
                              check_connection=pool.check_connection, **kwargs)
    else:
        new_pool = type(pool)(**kwargs)
    return redis.Redis(connection_pool=new_pool)


def native_sentinel_url(alias: str, location: str) -> str:
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


def default_timeouts() -> dict[str, Any]:
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


def from_url(url: str, *, asyncio_client: bool, timeouts: dict[str, Any] | None = None,
             resend: bool = True) -> Any:
    client = _from_url(url, asyncio_client=asyncio_client, timeouts=timeouts, resend=resend)
    return report_closed_transports(client) if asyncio_client else client


def _from_url(url: str, *, asyncio_client: bool, timeouts: dict[str, Any] | None,
              resend: bool) -> Any:
    parsed = parse_url(url)
    # retry_on_error: redis-py 5 re-sends only these errors, whatever ``retry`` says.
    options = {**(timeouts or default_timeouts()), "retry": _retry(asyncio_client),
               "retry_on_error": [RedisConnectionError], "retry_on_timeout": False}
    if not resend:
        options.update(no_resend_options(asyncio_client))
    if parsed.scheme == SENTINEL_SCHEME:
        return _sentinel_master(parsed, options, asyncio_client)
    if parsed.scheme == CLUSTER_SCHEME:
        return cluster(parsed, options, asyncio_client)
    if parsed.scheme not in ("redis", "rediss", "unix"):
        raise ConfigurationError(
            f"Unsupported Redis URL scheme {parsed.scheme!r} in {redact(url)!r}.")
    if parsed.tls:
        options.update(ssl_options(asyncio_client))
    module: Any = redis.asyncio if asyncio_client else redis
    return module.Redis.from_url(url, **options)


def _sentinel_master(parsed: ParsedURL, options: dict[str, Any], asyncio_client: bool) -> Any:
    if not parsed.path:
        raise ConfigurationError(
            "A redis+sentinel:// URL needs the service name: "
            "redis+sentinel://host:26379[,host:26379]/mymaster[/db]."
        )
    service = parsed.path[0]
    db = int(parsed.path[1]) if len(parsed.path) > 1 else 0
    sentinel_kwargs = {k: options[k] for k in ("socket_timeout", "socket_connect_timeout")}
    if "sentinel_password" in parsed.query:
        sentinel_kwargs["password"] = parsed.query["sentinel_password"]
    if parsed.tls:  # the sentinels and the servers they name
        tls = {"ssl": True, **ssl_options(asyncio_client)}
        sentinel_kwargs.update(tls)
        options = {**options, **tls}
    manager_class: Any = sentinel.AsyncFollowingSentinel if asyncio_client else (
        sentinel.FollowingSentinel)
    manager = manager_class(list(parsed.hosts), sentinel_kwargs=sentinel_kwargs, **options)
    return manager.master_for(service, db=db, **parsed.credentials)


def cluster(parsed: ParsedURL, options: dict[str, Any], asyncio_client: bool) -> Any:
    if parsed.path not in ((), ("0",)):
        raise ConfigurationError(
            f"Redis Cluster has only database 0; remove {'/' + '/'.join(parsed.path)!r} "
            "from the redis+cluster:// URL."
        )
    creds = parsed.credentials
    # The cluster client's own retry loop would re-send a command after a TimeoutError
    # (and re-send whole pipelines), so it gets zero retries: a timed-out script may have
    # run. Redirects (MOVED/ASK/TRYAGAIN) are not retries and are still followed.
    kwargs = {k: v for k, v in options.items()
              if k not in ("retry", "retry_on_error", "retry_on_timeout")}
    if parsed.tls:
        kwargs.update(ssl=True, **ssl_options())
        if asyncio_client and "ssl_password" in kwargs and not asyncio_cluster_takes_key_password():
            raise ConfigurationError(
                "The installed redis-py's asyncio Cluster client cannot decrypt a client key: "
                "give REDIS_PATTERNS['TLS'] an unencrypted KEYFILE (and no KEY_PASSWORD) "
                "for rediss+cluster:// connections used from async code.")
    if redis.VERSION < (6,):  # before 6, this count (not ``retry``) drives cluster re-sends
        # redis-py 5's asyncio pipeline makes range(count) attempts, so it needs 1 (which
        # lets a single asyncio command be re-sent once there; scripts are safe from it).
        kwargs["cluster_error_retry_attempts"] = 1 if asyncio_client else 0
    if asyncio_client:
        from redis.asyncio.cluster import ClusterNode as AsyncNode
        from redis.asyncio.cluster import RedisCluster as AsyncRedisCluster
        from redis.asyncio.retry import Retry as AsyncRetry

        class _AsyncCluster(AsyncRedisCluster):
            async def mget(self, keys: Any, *args: Any) -> Any:  # see _SyncCluster
                return await self.mget_nonatomic(keys, *args)

            async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
                try:  # see _SyncCluster.execute_command
                    return await super().execute_command(*args, **kwargs)
                except AttributeError as exc:
                    if await aunknown_redirect(self, exc) is None:
                        raise
                try:
                    return await super().execute_command(*args, **kwargs)
                except AttributeError as exc:
                    raise (await aunknown_redirect(self, exc) or exc) from exc

        nodes: list[Any] = [AsyncNode(h, p) for h, p in parsed.hosts]
        return _AsyncCluster(startup_nodes=nodes, retry=AsyncRetry(NoBackoff(), 0),
                             **creds, **kwargs)
    from redis.cluster import ClusterNode

    nodes = [ClusterNode(h, p) for h, p in parsed.hosts]
    return _SyncCluster(startup_nodes=nodes, retry=Retry(NoBackoff(), 0), **creds, **kwargs)


class _SyncCluster(RedisCluster):
    """``RedisCluster`` whose ``MGET`` accepts keys of several slots (one ``MGET`` per
    slot, not atomic across slots), as Django's ``cache.get_many()`` needs, whose
    pipelines never re-send a command, and which follows an ``ASK`` to a master that
    joined after its slot map was read."""

    def mget(self, keys: Any, *args: Any) -> Any:
        return self.mget_nonatomic(keys, *args)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        try:
            return super().execute_command(*args, **kwargs)
        except AttributeError as exc:
            error = unknown_redirect(self, exc)
            if error is None:
                raise
        # The command was not sent (clusterpipe.unknown_redirect); the slot map now lists
        # the new node, so it is sent once more, and only once.
        try:
            return super().execute_command(*args, **kwargs)
        except AttributeError as exc:
            raise (unknown_redirect(self, exc) or exc) from exc

    def pipeline(self, transaction: Any = None, shard_hint: Any = None) -> Any:
        """Non-transactional pipelines never re-send a command (:mod:`.clusterpipe`)."""
        pipe = super().pipeline(transaction, shard_hint)
        return pipe if transaction else pipeline_without_resend(pipe)
