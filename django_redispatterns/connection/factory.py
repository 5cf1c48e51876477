"""django-redis connection factories: Cluster and Sentinel locations, failover following."""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

from django_redis.pool import SentinelConnectionFactory as DjangoRedisSentinelFactory

from .build import default_timeouts, from_url, is_cluster
from .sentinel import FollowingSentinel
from .tls import with_tls_pool_kwargs
from .urls import CLUSTER_SCHEME, SENTINEL_SCHEME, plain_scheme


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
    factory (pools, parser and every option unchanged; a ``rediss://`` one gets the
    ``REDIS_PATTERNS["TLS"]`` certificates unless its pool keywords name its own).
    ``rediss+cluster://`` and ``rediss+sentinel://`` are the TLS forms. Cluster and
    Sentinel clients are built like the ones ``REDIS_PATTERNS`` URLs give (no re-send
    after a timeout; Sentinel clients follow a failover) and shared per process and
    location;
    ``SOCKET_TIMEOUT``/``SOCKET_CONNECT_TIMEOUT`` come from the cache's ``OPTIONS``, else
    from ``REDIS_PATTERNS``.
    """

    _shared: dict[tuple[Any, ...], Any] = {}
    # Not the connection package's lock: client_for() holds that one while django-redis
    # calls us.
    _shared_lock = threading.Lock()

    def __init__(self, options: dict[str, Any]) -> None:
        self.options = options

    def connect(self, url: str) -> Any:
        scheme = plain_scheme(urlsplit(url).scheme)
        if scheme not in (SENTINEL_SCHEME, CLUSTER_SCHEME):
            from django_redis.pool import ConnectionFactory as DjangoRedisFactory

            return DjangoRedisFactory(with_tls_pool_kwargs(url, self.options)).connect(url)
        timeouts = default_timeouts()
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
                    client = self._shared[key] = from_url(url, asyncio_client=False,
                                                          timeouts=timeouts)
        return client

    def disconnect(self, connection: Any) -> None:
        """Called by django-redis's ``close()`` (``CLOSE_CONNECTION``): shared Cluster and
        Sentinel clients stay open; plain clients drop their pooled sockets."""
        if not is_cluster(connection) and connection not in self._shared.values():
            connection.connection_pool.disconnect()


class SentinelConnectionFactory(DjangoRedisSentinelFactory):
    """django-redis's ``SentinelConnectionFactory`` whose clients follow a failover the
    moment the new primary is promoted (:mod:`.sentinel`); same options::

        "OPTIONS": {
            "CLIENT_CLASS": "django_redis.client.SentinelClient",
            "CONNECTION_FACTORY": "django_redispatterns.connection.SentinelConnectionFactory",
            "SENTINELS": [("10.0.0.1", 26379), ("10.0.0.2", 26379)],
        }
    """

    def __init__(self, options: dict[str, Any]) -> None:
        options.setdefault("CONNECTION_POOL_CLASS",
                           "django_redispatterns.connection.sentinel.FollowingPool")
        super().__init__(options)
        plain: Any = getattr(self, "_sentinel")  # noqa: B009 (set by the base class)
        self._sentinel = FollowingSentinel.like(plain)
        self._sentinels = tuple(sorted(tuple(s) for s in options["SENTINELS"]))

    def get_or_create_connection_pool(self, params: dict[str, Any]) -> Any:
        """django-redis shares pools per process by URL alone (``redis://mymaster/0``);
        two sets of sentinels with the same service name get a pool each here."""
        key = f"{params['url']} (sentinels {self._sentinels})"
        if key not in self._pools:
            self._pools[key] = self.get_connection_pool(params)
        return self._pools[key]
