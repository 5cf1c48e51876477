"""The cache's native asyncio clients: one ``redis.asyncio`` client per event loop and
location, and the single-flight flow's operations on it.

Native only where django-redis's sync machinery is not needed: a single ``redis://``,
``rediss://`` or ``unix://`` URL with the Default client and django-redis's own
connection factory. Sharding, Sentinel, Herd and custom factories return ``None`` here,
and the async API then runs the sync code in a thread.
"""

from __future__ import annotations

import asyncio
import weakref
from typing import Any, Protocol

import redis.asyncio
from django_redis.client import DefaultClient, HerdClient, SentinelClient, ShardClient
from redis.backoff import NoBackoff
from redis.exceptions import ConnectionError as RedisConnectionError

from ..connection import report_closed_transports
from ..connection.tls import asyncio_takes_key_password
from ..scripts import script

ASYNC_MAX_CONNECTIONS = 500
ASYNC_POOL_WAIT = 10.0  # seconds a coroutine waits for a free pooled connection

# One asyncio client per (event loop, location): backends are per thread / per task in
# Django, connection pools must not be.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)

_POOL_OPTIONS = ("health_check_interval", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile",
                 "ssl_keyfile", "ssl_password", "ssl_check_hostname", "client_name")


class Owner(Protocol):
    client: Any  # the backend's django-redis client: its ``_server`` list is the location


class AsyncClients:
    """Finds (or builds) the asyncio client of one backend on the running loop."""

    def __init__(self, owner: Owner, options: dict[str, Any], client_cls: type) -> None:
        self._owner = owner
        self._options = options
        self._client_cls = client_cls
        self._native: bool | None = None

    def get(self) -> Any:
        """A redis.asyncio client for this location on the running loop, or None when the
        configuration needs django-redis's sync machinery (run in a thread instead)."""
        if self._native is None:
            self._native = self._native_possible()
        if not self._native:
            return None
        loop = asyncio.get_running_loop()
        url = self._url()
        key = (url, id(self._options))
        per_loop = _async_clients.setdefault(loop, {})
        aclient = per_loop.get(key)
        if aclient is None:
            aclient = per_loop[key] = self._build(url)
        return aclient

    def _url(self) -> str:
        return str(self._owner.client._server[0])

    def _native_possible(self) -> bool:
        from django.conf import settings

        base = self._client_cls
        if not issubclass(base, DefaultClient) or issubclass(
            base, (HerdClient, ShardClient, SentinelClient)
        ):
            return False
        factory = self._options.get("CONNECTION_FACTORY") or getattr(
            settings, "DJANGO_REDIS_CONNECTION_FACTORY", None)
        if factory and factory != "django_redis.pool.ConnectionFactory":
            return False
        if (self._options.get("CONNECTION_POOL_KWARGS") or {}).get("ssl_password") and (
                not asyncio_takes_key_password()):
            return False  # an encrypted client key: django-redis's sync client, in a thread
        return self._url().split("://", 1)[0] in ("redis", "rediss", "unix")

    def _build(self, url: str) -> Any:
        from redis.asyncio.retry import Retry as AsyncRetry

        options = self._options
        kwargs: dict[str, Any] = {
            # Re-send only after a connection error, never after a timeout (a timed-out
            # command may have run).
            "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "retry_on_error": [RedisConnectionError],  # redis-py 5 retries only these
            "retry_on_timeout": False,
        }
        for option, name in (("SOCKET_TIMEOUT", "socket_timeout"),
                             ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
                             ("PASSWORD", "password"), ("USERNAME", "username")):
            if options.get(option) is not None:
                kwargs[name] = options[option]
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS", {})
        for name, value in pool_kwargs.items():
            if name in _POOL_OPTIONS:
                kwargs[name] = value
        # A blocking pool: a burst of coroutines waits for a connection instead of failing
        # with "Too many connections" (redis.asyncio's default pool holds 100).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=pool_kwargs.get("max_connections") or ASYNC_MAX_CONNECTIONS,
            timeout=ASYNC_POOL_WAIT, **kwargs,
        )
        return report_closed_transports(redis.asyncio.Redis(connection_pool=pool))


async def run(aclient: Any, op: tuple[Any, ...]) -> Any:
    """One Redis operation the single-flight flow yielded, on ``aclient``."""
    kind = op[0]
    if kind == "wait":
        return await aclient.blmove(op[1], op[1], op[2], "RIGHT", "LEFT") is not None
    keys, args = op[1], op[2]
    return await script(f"cache_{kind}").acall(aclient, keys, args)
