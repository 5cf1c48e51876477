"""The near cache: hot keys served from process memory, kept correct by Redis tracking.

Opt-in with ``OPTIONS["NEAR_CACHE"]`` (docs/cache.md, "Near cache"). A miss reads the key
on a connection of the near cache's own pool, which has ``CLIENT TRACKING on REDIRECT``
to the process's invalidation channel (:mod:`.nearlisten`), with one script that returns
the value and its PTTL (``lua/cache_near_get.lua``): one round trip, and the local copy
never outlives the key in Redis. The value is stored (:mod:`.nearstore`) only when

* the channel is healthy and was the same one (epoch) before the read and after it, and
  the read connection had tracking on for that epoch;
* no invalidation of the key (and no clear of the store) happened since the read began;
* it is not a ``get_or_set`` value already past its soft expiry (its deadline is capped
  at the soft expiry as well, so a stale value is never served from memory).

Redis forgets what a connection tracked once it closes, so every local entry is tied to
the fill connection that read it and dropped when that connection closes or is found
closed (:mod:`.nearfills`). ``aget`` fills through the same synchronous pool, in a worker
thread: no per-event-loop pools, so event loops that come and go (``asyncio.run`` per
call, ``async_to_sync``) leave no connections behind.

Single-server, Sentinel and Redis Cluster locations with django-redis's ``DefaultClient``
are supported (the near cache's own connections speak RESP2). On Cluster each primary has
its own channel and fill pool (:mod:`.nearcluster`); a fill answered ``MOVED`` or ``ASK``
empties the local store and reads the key through the cache's own client, unkept.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import redis
from django_redis.compressors.identity import IdentityCompressor
from django_redis.exceptions import CompressorError
from redis.exceptions import AskError, MovedError, NoScriptError
from redis.sentinel import SentinelConnectionPool

from ..connection import is_cluster
from ..exceptions import ConfigurationError
from ..scripts import script
from . import envelope, meta
from .nearcluster import ClusterChannels
from .nearfills import FillKeys
from .nearlisten import CHECKOUT, SILENT_LIMIT, Listener, tracked_class
from .nearstore import Entry, LocalStore, NearConfig

_SUPPORTED_POOLS = (redis.ConnectionPool, redis.BlockingConnectionPool, SentinelConnectionPool)
_all: weakref.WeakSet[NearCache] = weakref.WeakSet()
# Django builds one backend per thread and alias: they share one near cache per process
# and configuration (same LOCATION and OPTIONS), so a write by one thread drops the
# local copy every thread reads, and there is one channel, not one per thread.
Fetched = tuple[bytes, Any, Any]  # (raw, decode hint, get_or_set metadata or None)
_shared: dict[tuple[str, str], NearCache] = {}
_shared_lock = threading.Lock()


def shared(owner: Any, config: NearConfig, server: Any, options: dict[str, Any]) -> NearCache:
    """The process's near cache for ``server`` with ``options`` (created on first use)."""
    key = (repr(server), repr(sorted(options.items(), key=lambda item: str(item[0]))))
    with _shared_lock:
        near = _shared.get(key)
        if near is None:
            near = _shared[key] = NearCache(owner, config, repr(server))
            near._key = key
        return near


class NearCache:
    """One cache's near cache in this process. ``owner`` is the backend (``.client`` is
    its django-redis client, read lazily)."""

    def __init__(self, owner: Any, config: NearConfig, name: str) -> None:
        self._owner = owner
        self.config = config
        self.wants = config.wants
        self._name = re.sub(r"//[^@/]*@", "//***@", name)  # no credentials in logs
        self.store = LocalStore(config.max_entries, config.max_bytes)
        self.fills = FillKeys(self.store)
        self._setup = threading.Lock()
        self._pool: Any = None
        self.listener: Listener | ClusterChannels | None = None
        self._script = script("cache_near_get")
        self._loads: Callable[[bytes], Any] = lambda payload: None
        self._watch: Any = None
        self._watch_gen = 0
        self._key: tuple[str, str] | None = None
        _all.add(self)

    # --- the hit path -----------------------------------------------------------------

    def lookup(self, nkey: str) -> Entry | None:
        """The entry held locally for ``nkey`` (``decode(entry[2])`` is its value), or ``None``
        (then call :meth:`fetch`)."""
        listener = self.listener
        now = time.monotonic()
        if listener is None or not listener.ready or now - listener.heard >= SILENT_LIMIT:
            return None
        if self._watch is not None and self._watch.generation != self._watch_gen:
            self._primary_moved(listener)
            return None
        return self.store.get(nkey, now)

    def _primary_moved(self, listener: Listener | ClusterChannels) -> None:
        """Sentinel moved the primary: what the channel hears is no longer what fills read."""
        self._watch_gen = self._watch.generation
        listener.renew("the Sentinel primary moved")

    def decode(self, hint: Any) -> Any:
        """The value behind a decode hint, as ``get`` returns it: a fresh copy of a mutable
        value (deserialized on each hit, like any cache read), an int as is."""
        if hint.__class__ is tuple:
            return hint[0]
        return self._loads(hint)

    # --- a miss -----------------------------------------------------------------------

    def fetch(self, nkey: str) -> Fetched | None:
        """GET ``nkey`` from Redis (one round trip), keeping it locally when that is safe
        (module docstring): ``(raw, decode hint, get_or_set metadata or None)``, or
        ``None`` when there is no such key.
        Redis errors propagate."""
        channels = self.listener or self._start()
        if isinstance(channels, ClusterChannels):
            route = channels.route(nkey)
            if route is None:
                return self._unkept(nkey)
            listener, pool = route
        else:
            listener, pool = channels, self._pool
            if self._watch is not None and self._watch.generation != self._watch_gen:
                self._primary_moved(listener)
        ticket = self.store.ticket()
        epoch = listener.epoch
        ready = listener.ready
        conn = pool.get_connection(*CHECKOUT)
        started = time.monotonic()  # before Redis reads the PTTL: the copy dies no later
        moved: Exception | None = None
        conn.rp_busy = True
        try:
            if ready and conn.rp_epoch != epoch:
                self._track(conn, listener, epoch)
            self.fills.note(conn, nkey)  # before the read: a close during it refuses it
            reply = self._eval(conn, nkey)
            tracked = conn.rp_epoch == epoch
        except (MovedError, AskError) as exc:  # only on Cluster: the slot has moved (on)
            moved = exc
        except BaseException:
            conn.disconnect()  # drops what conn filled (Redis forgets its tracking)
            raise
        finally:
            conn.rp_busy = False
            pool.release(conn)
        if moved is not None:
            return self._slot_moved(channels, nkey, moved)
        return self._keep(nkey, reply, tracked, listener, epoch, ticket, started)

    def _slot_moved(self, channels: Any, nkey: str, exc: Exception) -> Fetched | None:
        """A Cluster fill was answered MOVED (a new slot map: new channels) or ASK (a
        migration in progress): empty the store and read through the cache's client."""
        if isinstance(exc, MovedError):
            channels.renew(f"slot moved ({exc})")
        else:
            self.store.clear()
        return self._unkept(nkey)

    def _unkept(self, nkey: str) -> Fetched | None:
        """``nkey`` read through the cache's own client (it follows MOVED / ASK), not kept."""
        # Two GETs, not one MGET: during a slot migration the two keys may sit on two
        # nodes for a moment, and a multi-key read is refused until they meet again.
        client = self._owner.client.get_client(write=True)
        raw = client.get(nkey)
        return None if raw is None else (raw, _hint(raw), client.get(self._meta_key(nkey)))

    async def afetch(self, nkey: str) -> Fetched | None:
        """:meth:`fetch` in a worker thread (one pool for sync and async callers)."""
        return await asyncio.to_thread(self.fetch, nkey)

    def _keep(self, nkey: str, reply: Any, tracked: bool, listener: Listener, epoch: int,
              ticket: int, started: float) -> Fetched | None:
        """A fill's answer: stored locally when that is safe (module docstring)."""
        if not reply:
            return None
        raw, pttl = reply[0], int(reply[1])
        record = reply[2] if len(reply) > 2 else None
        hint = _hint(raw)
        if tracked and listener.epoch == epoch and listener.ready:
            deadline = self._deadline(raw, pttl, started, record)
            if deadline is not None:
                self.store.put(nkey, raw, deadline, ticket, hint)
        return raw, hint, record

    def _deadline(self, raw: bytes, pttl: int, started: float,
                  record: Any = None) -> float | None:
        """When the local copy of ``raw`` must be dropped (``time.monotonic()``), or
        ``None`` when it must not be stored at all. ``started``: when the read was sent
        (the PTTL counts from a moment after it); ``record``: the value's ``get_or_set``
        metadata (its soft expiry bounds the copy, as an envelope's does)."""
        limit = math.inf if pttl < 0 else pttl / 1000.0
        if self.config.max_local_ttl is not None:
            limit = min(limit, self.config.max_local_ttl)
        deadline = started + limit
        found = envelope.times(raw) if envelope.is_envelope(raw) else meta.times(record, raw)
        if found is not None:  # its soft expiry is wall-clock time
            deadline = min(deadline, time.monotonic() + found[0] - time.time())
        return None if deadline <= time.monotonic() else deadline

    def _eval(self, conn: Any, nkey: str) -> Any:
        try:
            conn.send_command("EVALSHA", self._script.sha, 2, nkey, self._meta_key(nkey))
            return conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", self._script.source, 2, nkey, self._meta_key(nkey))
            return conn.read_response()

    def _meta_key(self, nkey: str) -> str:
        return str(self._owner._codec.meta_key(nkey))

    @staticmethod
    def _track(conn: Any, listener: Listener, epoch: int) -> None:
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

    def _loader(self) -> Callable[[bytes], Any]:
        """django-redis's decode without its int probe (the hint made it already)."""
        client = self._owner.client
        compressor, loads = client._compressor, client._serializer.loads
        if type(compressor) is IdentityCompressor:
            return loads

        def decompress_and_load(payload: bytes) -> Any:
            with contextlib.suppress(CompressorError):  # small values are left as they are
                payload = compressor.decompress(payload)
            return loads(payload)

        return decompress_and_load

    # --- writes of this process -------------------------------------------------------

    def forget(self, nkeys: list[str]) -> None:
        """This process wrote ``nkeys``: drop their entries and any fill in flight."""
        self.store.invalidate(nkeys)

    def forget_all(self) -> None:
        self.store.clear()

    # --- setup ------------------------------------------------------------------------

    def _start(self) -> Listener | ClusterChannels:
        with self._setup:
            if self.listener is None and is_cluster(
                    base := self._owner.client.get_client(write=True)):
                self._loads = self._loader()
                self.listener = ClusterChannels(base, _pools, self.store.invalidate,
                                                self.store.clear, self._name,
                                                self.fills.sweep)
            if self.listener is None:
                self._pool, channel = _pools(base)
                self._loads = self._loader()
                # A Sentinel pool that follows failovers (ours) has a watch whose
                # generation moves with the primary: the channel then moves too.
                self._watch = getattr(self._pool, "_watch", None)
                self._watch_gen = getattr(self._watch, "generation", 0)

                def connect() -> Any:
                    conn = channel.make_connection()
                    conn.connect()
                    return conn

                self.listener = Listener(connect, self.store.invalidate, self.store.clear,
                                         self._name, self.fills.sweep)
            return self.listener

    def stop(self) -> None:
        """Stop the channel's thread and close the near cache's connections; the next
        backend built for this configuration starts a new near cache."""
        with _shared_lock:
            if self._key is not None and _shared.get(self._key) is self:
                del _shared[self._key]
        with self._setup:
            listener, self.listener = self.listener, None
            pool, self._pool = self._pool, None
        if listener is not None:
            listener.stop()
        if pool is not None:
            pool.disconnect()
        self.store.clear()

    def _after_fork(self) -> None:
        # The thread did not survive the fork and its connection is the parent's.
        self.listener = None
        self._pool = None
        self.fills = FillKeys(self.store)
        self._setup = threading.Lock()
        self.store.clear()


def _hint(raw: bytes) -> Any:
    """How a hit decodes ``raw``: ``(int,)`` for django-redis's plain ints (immutable,
    returned as is), else the serialized payload (an envelope's without its header)."""
    if envelope.is_envelope(raw):
        return raw[envelope.HEADER_LEN:]
    first = raw[:1]
    if first and (first in b"+-0123456789" or first.isspace()):  # what int() may accept
        with contextlib.suppress(ValueError):
            return (int(raw),)
    return raw


def _pools(base: Any) -> tuple[Any, Any]:
    """Two pools like ``base``'s (same server, Sentinel service or Cluster node, same
    options): the fills' (connections that can track, same size) and the channel's (no
    socket timeout: it waits with ``can_read``)."""
    pool = base.connection_pool
    if not isinstance(pool, _SUPPORTED_POOLS):
        raise ConfigurationError(
            "CACHES OPTIONS['NEAR_CACHE'] needs a single-server or Sentinel LOCATION; this "
            f"cache's connection pool is {type(pool).__name__}.")
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


def _like(pool: Any, connection_class: type, kwargs: dict[str, Any]) -> Any:
    if isinstance(pool, SentinelConnectionPool):
        return type(pool)(pool.service_name, pool.sentinel_manager, is_master=True,
                          check_connection=pool.check_connection,
                          connection_class=connection_class,
                          max_connections=pool.max_connections, **kwargs)
    return type(pool)(connection_class=connection_class, max_connections=pool.max_connections,
                      **kwargs)


def _reset_after_fork() -> None:
    for near in list(_all):
        near._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)

