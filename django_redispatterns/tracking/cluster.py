"""Tracking on Redis Cluster: one invalidation channel and one fill pool per primary.

A node only redirects tracking messages to a connection of its own, so each primary gets
its own :class:`~.listener.Listener` (one connection and thread per primary, per
process), and a key is filled through a tracking connection to the primary that owns its
slot, redirected to that primary's channel. :class:`ClusterChannels` looks like one
listener to the hit path: it is ``ready`` only while every primary's channel is, and has
``heard`` from Redis as recently as its quietest channel.

On a topology change the local store is emptied and the channels rebuilt from a fresh
slot map (:meth:`ClusterChannels.renew`): when a fill is answered ``MOVED``, when the
cache's client now maps the key's slot to another primary than when the channels were
built (it followed a ``MOVED`` of its own), and when a channel has stayed down for
:data:`RETHINK_AFTER` seconds (its node failed over or left).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from .listener import SILENT_LIMIT, Listener, logger
from .reads import channel_connector

RETHINK_AFTER = 2.0  # seconds a channel may stay down before the slot map is read again


class ClusterChannels:
    """Every primary's channel and fill pool for one local store. ``base`` is the
    ``RedisCluster``; ``pools(node_client)`` returns ``(fills, channel)`` pools for one
    node; ``invalidate`` and ``clear`` are the local store's, ``sweep`` its fill
    connections' check (:mod:`.fills`), ``timing`` the channels' ``ping_every`` and
    ``silent_limit`` (:class:`~.listener.Listener`)."""

    def __init__(self, base: Any, pools: Callable[[Any], tuple[Any, Any]],
                 invalidate: Callable[[list[str]], None], clear: Callable[[], None],
                 name: str, sweep: Callable[[], None] = lambda: None,
                 **timing: float) -> None:
        self._base = base
        self._timing = timing  # the Listeners' ping_every / silent_limit
        self.silent_limit = float(timing.get("silent_limit", SILENT_LIMIT))
        self._sweep = sweep
        self._pools = pools
        self._invalidate = invalidate
        self._clear = clear
        self._name = name
        self._lock = threading.Lock()
        self._nodes: dict[str, tuple[Listener, Any]] = {}
        self._owners: dict[int, str] = {}
        self._retired_losses = 0
        self._down_since: float | None = None
        self._built = 0.0
        self.rebuilds = 0  # for tests and logs
        self._build()

    # --- what the hit path reads -----------------------------------------------------

    @property
    def ready(self) -> bool:
        nodes = self._nodes
        return bool(nodes) and all(listener.ready for listener, _ in nodes.values())

    @property
    def heard(self) -> float:
        return min((listener.heard for listener, _ in self._nodes.values()), default=0.0)

    @property
    def losses(self) -> int:
        return self._retired_losses + sum(lst.losses for lst, _ in self._nodes.values())

    def listeners(self) -> dict[str, Listener]:
        """Each primary's channel, by node name (``host:port``)."""
        return {name: listener for name, (listener, _) in self._nodes.items()}

    def wait_ready(self, timeout: float) -> bool:
        """Block until every primary's channel is subscribed, up to ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        for listener in list(self.listeners().values()):
            listener.wait_ready(max(0.0, deadline - time.monotonic()))
        return self.ready

    # --- a fill ----------------------------------------------------------------------

    def route(self, nkey: str) -> tuple[Listener, Any] | None:
        """The channel and fill pool of ``nkey``'s primary, or ``None`` when its slot has
        another owner than when the channels were built (then they are rebuilt)."""
        self._check()
        seen = self.rebuilds
        base = self._base
        slot = base.keyslot(nkey)
        node = base.nodes_manager.get_node_from_slot(slot)
        if self._owners.get(slot) != node.name:
            self.renew(f"slot {slot} moved to {node.name}", seen)
            return None
        return self._nodes.get(node.name)

    def _check(self) -> None:
        """A channel down for :data:`RETHINK_AFTER` seconds: read the slot map again."""
        if self.ready:
            self._down_since = None
            return
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif now - self._down_since >= RETHINK_AFTER and now - self._built >= RETHINK_AFTER:
            self.renew("a primary's channel stayed down", self.rebuilds)

    # --- topology changes ------------------------------------------------------------

    def renew(self, why: str, seen: int | None = None) -> None:
        """The topology changed (``why``): empty the store, read the slot map again and
        give every primary a new channel (fills of the old channels' epochs are not
        kept). With ``seen``, only if no rebuild happened since ``rebuilds`` was ``seen``."""
        with self._lock:
            if seen is not None and seen != self.rebuilds:
                return
            logger.warning("near cache %s: %s; emptying the local cache and subscribing "
                           "again on every primary", self._name, why)
            old, self._nodes = self._nodes, {}
            for listener, pool in old.values():
                listener.stop(join=False)
                self._retired_losses += listener.losses
                pool.disconnect()
            self._clear()
            try:
                self._base.nodes_manager.initialize()
            finally:
                self._build()
                self.rebuilds += 1

    def _build(self) -> None:
        nodes: dict[str, tuple[Listener, Any]] = {}
        for node in self._base.get_primaries():
            client = node.redis_connection
            if client is None:
                continue
            fills, channel = self._pools(client)
            listener = Listener(channel_connector(channel), self._invalidate, self._clear,
                                f"{self._name} {node.name}", self._sweep, **self._timing)
            nodes[node.name] = (listener, fills)
        self._nodes = nodes
        # who owned each slot when the channels were built: a fill that finds another
        # owner (the client followed a MOVED since) empties the store first
        self._owners = {slot: owners[0].name
                        for slot, owners in self._base.nodes_manager.slots_cache.items()
                        if owners and owners[0].name in nodes}
        self._built = time.monotonic()
        self._down_since = None

    def stop(self) -> None:
        with self._lock:
            old, self._nodes = self._nodes, {}
        for listener, pool in old.values():
            listener.stop()
            pool.disconnect()
