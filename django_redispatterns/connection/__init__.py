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
may already have run.

``get_client(feature, resend=False)`` (and ``get_async_client``/``client_for``/
``async_client_for`` with ``resend=False``) gives a client that never re-sends a command,
not even after a connection error (a connection can break after the command was sent):
for features whose calls are not idempotent and carry no request id. For a CACHES alias
it is a second client over its own pool with the alias pool's connection options, retries
off; it is built once per process.

Cluster clients re-send nothing themselves (redis-py's ``RedisCluster`` would re-send a
timed-out command, pipelines included): they still follow ``MOVED``/``ASK`` and refresh the
slot map after a connection error, and :mod:`..scripts` retries, with bounded back-off,
only the calls the cluster *rejected before running them* (``TRYAGAIN`` during a slot
migration, ``CLUSTERDOWN`` during a failover). Sentinel clients follow a failover as soon
as the new primary is promoted (:mod:`.sentinel`). See ``docs/scale.md``.

Inside: :mod:`.urls` reads and redacts URLs, :mod:`.build` builds clients, :mod:`.sentinel`
follows Sentinel failovers, :mod:`.factory` plugs all of it into django-redis,
:mod:`.transport` makes asyncio clients report a connection reset under uvloop as the
``ConnectionError`` it is.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from typing import Any

from django.core.signals import setting_changed
from django.dispatch import receiver

from ..conf import SETTING_NAME, get_config
from .build import build_async, build_sync, is_cluster
from .factory import ConnectionFactory, SentinelConnectionFactory
from .transport import report_closed_transports
from .urls import CLUSTER_SCHEME, SENTINEL_SCHEME, ParsedURL, parse_url, redact, redact_text

__all__ = [
    "CLUSTER_SCHEME", "SENTINEL_SCHEME", "ConnectionFactory", "ParsedURL",
    "SentinelConnectionFactory", "async_client_for", "client_for", "get_async_client",
    "get_client", "is_cluster", "parse_url", "redact", "redact_text",
    "report_closed_transports", "reset_clients",
]

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
                client = _clients[key] = build_sync(connection, resend)
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
        client = per_loop[key] = build_async(connection, resend)
    return client


def reset_clients() -> None:
    """Forget cached clients (settings changed). Their pools close when collected."""
    with _lock:
        _clients.clear()
    _async_clients.clear()


@receiver(setting_changed, dispatch_uid="django_redispatterns.connection.reset_clients")
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting in (SETTING_NAME, "CACHES", "SECRET_KEY"):
        reset_clients()
