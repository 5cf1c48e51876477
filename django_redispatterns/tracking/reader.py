"""One local store kept correct by tracking, for one client: what a feature builds on.

:class:`TrackedReads` owns the store, the fill connections' bookkeeping, the fill pool and
the invalidation channel (one per primary on Cluster) of one Redis client in this process,
started on the first read. A feature asks :meth:`TrackedReads.lookup` first and, on a
miss, :meth:`TrackedReads.read` with the command that reads the key; it stores what that
answered only when :meth:`.reads.Read.keepable` says so, with the ``ticket`` of the read.

Entries are served only while the channel is healthy (subscribed and caught up within
``silent_limit`` seconds, :mod:`.listener`); a Sentinel failover (the pool's primary
moved), a Cluster slot move (``MOVED``, or the client now maps the key elsewhere) or an
``ASK`` empties the store. After a fork the child starts with an empty store and no
channel (the parent's thread did not survive it).
"""

from __future__ import annotations

import os
import re
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

from redis.exceptions import AskError, MovedError

from ..connection import is_cluster
from .cluster import ClusterChannels
from .fills import FillKeys
from .listener import Listener
from .reads import Read, channel_connector, tracked_read, tracking_pools
from .store import Entry, LocalStore

_all: weakref.WeakSet[TrackedReads] = weakref.WeakSet()


class TrackedReads:
    """The local store of the client ``client()`` returns (read lazily, on the first read).

    ``setting`` names the setting that turned this on (in errors), ``name`` the server (in
    logs, credentials masked); ``timing`` the channel's ``ping_every`` / ``silent_limit``."""

    def __init__(self, client: Callable[[], Any], max_entries: int, max_bytes: int,
                 setting: str, name: str, **timing: float) -> None:
        self._client = client
        self._setting = setting
        self._name = re.sub(r"//[^@/]*@", "//***@", name)  # no credentials in logs
        self._timing = timing
        self.store = LocalStore(max_entries, max_bytes)
        self.fills = FillKeys(self.store)
        self.listener: Listener | ClusterChannels | None = None
        self.pool: Any = None
        self._setup = threading.Lock()
        self._watch: Any = None
        self._watch_gen = 0
        _all.add(self)

    # --- the hit path -----------------------------------------------------------------

    def lookup(self, key: str) -> Entry | None:
        """The live entry held for ``key`` while the channel is healthy, else ``None``."""
        listener = self.listener
        now = time.monotonic()
        if (listener is None or not listener.ready
                or now - listener.heard >= listener.silent_limit):
            return None
        if self._watch is not None and self._watch.generation != self._watch_gen:
            self._primary_moved(listener)
            return None
        return self.store.get(key, now)

    def _primary_moved(self, listener: Listener | ClusterChannels) -> None:
        """Sentinel moved the primary: what the channel hears is no longer what fills read."""
        self._watch_gen = self._watch.generation
        listener.renew("the Sentinel primary moved")

    # --- a miss -----------------------------------------------------------------------

    def read(self, key: str, request: Callable[[Any], Any]) -> Read | None:
        """``request(conn)`` on a tracking connection to ``key``'s server (Redis errors
        propagate), or ``None`` when no channel covers ``key`` now (a Cluster slot moved,
        or is moving): then read it through the feature's own client, and keep nothing."""
        channels = self.listener or self._start()
        if isinstance(channels, ClusterChannels):
            route = channels.route(key)
            if route is None:
                return None
            listener, pool = route
        else:
            listener, pool = channels, self.pool
            if self._watch is not None and self._watch.generation != self._watch_gen:
                self._primary_moved(listener)
        try:
            return tracked_read(self.fills, listener, pool, key, request)
        except MovedError as exc:  # a new slot map: new channels
            channels.renew(f"slot moved ({exc})")
        except AskError:  # a migration in progress
            self.store.clear()
        return None

    def forget(self, keys: list[str]) -> None:
        """This process wrote ``keys``: drop their entries and refuse their reads in flight."""
        self.store.invalidate(keys)

    def forget_all(self) -> None:
        """This process wrote keys it cannot name: drop every entry and read in flight."""
        self.store.clear()

    # --- setup ------------------------------------------------------------------------

    def _start(self) -> Listener | ClusterChannels:
        with self._setup:
            if self.listener is not None:
                return self.listener
            base = self._client()
            store = self.store
            if is_cluster(base):
                self.listener = ClusterChannels(base, self._pools, store.invalidate,
                                                store.clear, self._name, self.fills.sweep,
                                                **self._timing)
                return self.listener
            self.pool, channel = self._pools(base)
            # A Sentinel pool that follows failovers (ours) has a watch whose generation
            # moves with the primary: the channel then moves too.
            self._watch = getattr(self.pool, "_watch", None)
            self._watch_gen = getattr(self._watch, "generation", 0)
            self.listener = Listener(channel_connector(channel), store.invalidate, store.clear,
                                     self._name, self.fills.sweep, **self._timing)
            return self.listener

    def _pools(self, base: Any) -> tuple[Any, Any]:
        return tracking_pools(base, self._setting)

    def stop(self) -> None:
        """Stop the channel's thread, close the connections and empty the store; the next
        read starts again."""
        with self._setup:
            listener, self.listener = self.listener, None
            pool, self.pool = self.pool, None
        if listener is not None:
            listener.stop()
        if pool is not None:
            pool.disconnect()
        self.store.clear()

    def _after_fork(self) -> None:
        # The thread did not survive the fork and its connection is the parent's.
        self.listener = None
        self.pool = None
        self.fills = FillKeys(self.store)
        self._setup = threading.Lock()
        self.store.clear()


def _reset_after_fork() -> None:
    for reads in list(_all):
        reads._after_fork()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)
