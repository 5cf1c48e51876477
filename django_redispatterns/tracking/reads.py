"""Reading a key on a tracking connection, and the pools such connections come from.

:func:`tracked_read` is the only way a value gets into a local store: it captures the
store's ticket and the channel's epoch *before* the read, turns tracking on for the
connection when it is not on for this epoch, notes the key against the connection before
the command is sent (a close during the read refuses the value), and tells the caller
whether the answer may be kept (:attr:`Read.keepable`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any, NamedTuple

import redis
from redis.exceptions import AskError, MovedError
from redis.sentinel import SentinelConnectionPool

from ..exceptions import ConfigurationError
from .fills import FillKeys
from .listener import CHECKOUT, Listener, tracked_class

_SUPPORTED_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool, SentinelConnectionPool)


class Read(NamedTuple):
    """What one tracked read answered, and what decides whether it may be kept."""

    reply: Any
    tracked: bool  # tracking was on for the read's connection in ``epoch``
    epoch: int  # the channel's epoch when the read began
    ticket: int  # the store's ticket taken before the read
    started: float  # time.monotonic() before the read was sent
    listener: Listener  # the channel the read's connection redirects to

    def deadline(self, pttl_ms: int, cap: float | None) -> float:
        """When a copy of the answer must go (``time.monotonic()``): the key's TTL as Redis
        reported it (``pttl_ms`` < 0: none), counted from before the read was sent, and at
        most ``cap`` seconds (``MAX_LOCAL_TTL``; None: no cap)."""
        limit = math.inf if pttl_ms < 0 else pttl_ms / 1000.0
        if cap is not None:
            limit = min(limit, cap)
        return self.started + limit

    def keepable(self) -> bool:
        """True when the answer may be stored: tracked, and the channel healthy and the same
        one since before the read (the store's ticket makes its own check in ``put``)."""
        listener = self.listener
        return self.tracked and listener.epoch == self.epoch and listener.ready


def tracked_read(fills: FillKeys, listener: Listener, pool: Any, key: str,
                 request: Callable[[Any], Any]) -> Read:
    """``request(conn)`` (send and read one answer) on a tracking connection of ``pool``.

    Redis errors propagate; any other failure closes the connection, which drops what it
    filled. ``MOVED`` / ``ASK`` (Cluster) propagate with the connection kept."""
    ticket = fills.store.ticket()
    epoch = listener.epoch
    ready = listener.ready
    conn = pool.get_connection(*CHECKOUT)
    started = time.monotonic()  # before Redis reads the PTTL: the copy dies no later
    conn.rp_busy = True
    try:
        if ready and conn.rp_epoch != epoch:
            enable_tracking(conn, listener, epoch)
        fills.note(conn, key)  # before the read: a close during it refuses it
        reply = request(conn)
        tracked = conn.rp_epoch == epoch
    except (MovedError, AskError):
        raise
    except BaseException:
        conn.disconnect()  # drops what conn filled (Redis forgets its tracking)
        raise
    finally:
        conn.rp_busy = False
        pool.release(conn)
    return Read(reply, tracked, epoch, ticket, started, listener)


def enable_tracking(conn: Any, listener: Listener, epoch: int) -> None:
    """``CLIENT TRACKING on REDIRECT`` the channel, for ``epoch``, on ``conn``."""
    client_id = listener.client_id
    if client_id is None:
        return
    conn.send_command("CLIENT", "TRACKING", "on", "REDIRECT", client_id)
    try:
        conn.read_response()
    except redis.ResponseError as exc:
        listener.refused(epoch, exc)
        return
    conn.rp_epoch = epoch


def tracking_pools(base: Any, setting: str) -> tuple[Any, Any]:
    """Two pools like ``base``'s (same server, Sentinel service or Cluster node, same
    options): the reads' (connections that can track, same size) and the channel's (no
    socket timeout: it waits with ``can_read``). ``setting`` names what asked, for the
    error raised on a pool that cannot track."""
    pool = base.connection_pool
    if not isinstance(pool, _SUPPORTED_POOLS):
        raise ConfigurationError(
            f"{setting} needs a single-server, Sentinel or Cluster location; this "
            f"connection pool is {type(pool).__name__}.")
    # RESP2 whatever the cache's own connections speak: invalidations then arrive as
    # Pub/Sub messages on the channel's connection, and replies carry no push frames.
    # (redis-py's maintenance notifications are RESP3-only: leave them to the cache's own.)
    kwargs = {k: v for k, v in pool.connection_kwargs.items()
              if "maint_notifications" not in k and k != "connection_pool"}
    kwargs["protocol"] = 2
    fills = _like(pool, tracked_class(pool.connection_class), kwargs)
    kwargs.pop("client_name", None)
    channel = _like(pool, pool.connection_class, {**kwargs, "socket_timeout": None})
    return fills, channel


def channel_connector(channel_pool: Any) -> Callable[[], Any]:
    """What a :class:`~.listener.Listener` calls for a new, connected channel connection."""

    def connect() -> Any:
        conn = channel_pool.make_connection()
        conn.connect()
        return conn

    return connect


def _like(pool: Any, connection_class: type, kwargs: dict[str, Any]) -> Any:
    if isinstance(pool, SentinelConnectionPool):
        return type(pool)(pool.service_name, pool.sentinel_manager, is_master=True,
                          check_connection=pool.check_connection,
                          connection_class=connection_class,
                          max_connections=pool.max_connections, **kwargs)
    return type(pool)(connection_class=connection_class, max_connections=pool.max_connections,
                      **kwargs)
