"""Which local entries each fill connection read, so they go when that connection closes.

Redis tracks a key for the connection that read it: once that connection closes —
``CLIENT KILL``, the server's idle ``timeout``, a fill that raised and disconnected, a
timeout, the pool closing it — Redis forgets the key and will never announce its change.
So every fill connection remembers the keys filled through it since it connected, and
:class:`FillKeys` drops those local entries (and refuses their fills in flight)

* the moment the connection is disconnected on this side, for any reason (every close
  in redis-py goes through ``disconnect()``, which :func:`.listener.tracked_class`
  hooks), and
* when an idle pooled connection is found closed by the server: the channel's thread
  calls :meth:`FillKeys.sweep` after each PING answer, which polls the sockets of the
  idle fill connections (readable while idle means the server closed it), and
* at that sweep too for a connection garbage-collected without a close (its socket
  closes with it; the whole store is emptied, as that may run under the store's lock).

A key is noted *before* its fill is sent, so a close during the fill refuses the value.
"""

from __future__ import annotations

import select
import threading
import weakref
from typing import Any

from .store import LocalStore


class FillKeys:
    """The keys of ``store`` that each fill connection read (``conn.rp_keys``)."""

    def __init__(self, store: LocalStore) -> None:
        self.store = store
        self._lock = threading.RLock()  # a close may come from inside a locked section
        self._conns: weakref.WeakSet[Any] = weakref.WeakSet()
        self.dropped_conns = 0  # connections whose keys were dropped (for tests and logs)
        self.orphaned = False  # a connection holding keys was garbage-collected

    def note(self, conn: Any, nkey: str) -> None:
        """``nkey`` is about to be filled through ``conn`` (checked out by the caller)."""
        with self._lock:
            keys = conn.rp_keys
            if keys is None:
                keys = conn.rp_keys = set()
                conn.rp_fills = self
                self._conns.add(conn)
            elif len(keys) >= 2 * self.store.max_entries:
                # Bounded: keep what is still held (no other fill is in flight on conn).
                keys = conn.rp_keys = {k for k in keys if k in self.store}
            keys.add(nkey)

    def dropped(self, conn: Any) -> None:
        """``conn`` closed (or was found closed): drop what it filled; its next use sets
        tracking up again."""
        with self._lock:
            keys, conn.rp_keys = conn.rp_keys, None
            conn.rp_epoch = None
            if keys:
                self.dropped_conns += 1
                self.store.invalidate(list(keys))

    def sweep(self) -> None:
        """Drop the keys of every idle fill connection the server has closed. Safe against
        a fill racing it: at worst a live connection's keys are dropped (extra misses)."""
        if self.orphaned:  # its keys are unknown now: drop everything
            self.orphaned = False
            self.store.clear()
        with self._lock:
            candidates = [c for c in self._conns if c.rp_keys and not c.rp_busy]
        socks = {}
        for conn in candidates:
            sock = getattr(conn, "_sock", None)
            if sock is not None:
                try:
                    socks[sock.fileno()] = conn
                except OSError:  # closed under us
                    continue
        for fd in _readable(list(socks)):
            self.dropped(socks[fd])


def _readable(fds: list[int]) -> list[int]:
    """The descriptors among ``fds`` with data or EOF waiting (no wait)."""
    fds = [fd for fd in fds if fd >= 0]
    if not fds:
        return []
    if hasattr(select, "poll"):
        poller = select.poll()
        for fd in fds:
            poller.register(fd, select.POLLIN | select.POLLPRI)
        return [fd for fd, _ in poller.poll(0)]
    return list(select.select(fds, [], [], 0)[0])
