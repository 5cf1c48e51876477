"""The invalidation channel: one connection and one thread per local store and server, per process.

The thread keeps a RESP2 connection subscribed to ``__redis__:invalidate``. Redis sends
there the names of keys that the store's read connections fetched and somebody
(any client) then changed, expired, evicted or flushed — because each read connection
runs ``CLIENT TRACKING on REDIRECT <this connection's id>`` (:func:`tracked_class`).

The channel is *healthy* while it is subscribed and *caught up*: it sends a numbered
PING every :data:`PING_EVERY` seconds, queued behind whatever invalidations Redis has
for it, and :attr:`Listener.heard` is the send time of the newest PING whose answer
arrived — so every invalidation Redis sent before that moment has been applied. A message
alone proves nothing (a channel far behind a burst still receives messages). When
``heard`` is :data:`SILENT_LIMIT` seconds old — the connection dropped or was killed, the
server restarted, failed over or hung, or the channel lags behind a burst — the hit path
bypasses the local store, and :meth:`Listener.lose` empties it and the thread subscribes
again (a new connection starts with no backlog). Every (re)subscription starts a new
*epoch*; a read connection set up for another epoch enables tracking again before its
value may be stored. After each PING answer the thread also calls ``sweep`` (the fill
connections' check for sockets the server closed, :mod:`.fills`).
"""

from __future__ import annotations

import functools
import inspect
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

logger = logging.getLogger("django_redispatterns.cache")


def _checkout_args(get_connection: Callable[..., Any]) -> tuple[str, ...]:
    """What a pool's ``get_connection`` needs: redis-py before 5.1 requires a command name
    (unused by the pool), later versions deprecate passing one."""
    parameter = inspect.signature(get_connection).parameters.get("command_name")
    needed = parameter is not None and parameter.default is inspect.Parameter.empty
    return ("GET",) if needed else ()


#: The arguments of a pool checkout on the installed redis-py.
CHECKOUT = _checkout_args(redis.ConnectionPool.get_connection)

CHANNEL = b"__redis__:invalidate"
PING_EVERY = 1.0  # seconds between numbered PINGs, whatever else arrives
SILENT_LIMIT = 3.0  # seconds since the newest answered PING was sent: then the channel is lost
RETRY_MAX = 1.0  # longest wait between reconnection attempts


@functools.cache
def tracked_class(base: type) -> type:
    """``base`` (a redis-py connection class) whose every close — ``disconnect()``, which
    every path that drops a socket goes through, whatever caused it — forgets its tracking
    setup (a value read on the next socket is stored only after tracking is enabled on it)
    and drops the local entries filled through it (:mod:`.fills`). The hook is on the
    close, not on the connect: redis-py 6+ ``connect()`` no longer calls ``on_connect()``."""

    def disconnect(self: Any, *args: Any, **kwargs: Any) -> None:
        if self.rp_keys is not None:
            self.rp_fills.dropped(self)
        self.rp_epoch = None
        base.disconnect(self, *args, **kwargs)  # type: ignore[attr-defined]

    def __del__(self: Any) -> None:
        # Garbage collection may run while this thread holds the store's lock: take no
        # lock here, let the channel's thread empty the store at its next sweep.
        if self.rp_keys:
            self.rp_keys = None
            self.rp_fills.orphaned = True
        base_del = getattr(base, "__del__", None)
        if base_del is not None:
            base_del(self)

    return type(f"NearTracked{base.__name__}", (base,),
                {"disconnect": disconnect, "__del__": __del__, "rp_epoch": None,
                 "rp_keys": None, "rp_fills": None, "rp_busy": False})


class Listener:
    """The background thread reading invalidations for one local store.

    ``invalidate(nkeys)`` and ``clear()`` are the store's; ``connect()`` returns a new,
    connected redis-py connection to the cache's primary; ``sweep()`` runs after each
    PING answer. ``ping_every`` and ``silent_limit`` (seconds) default to
    :data:`PING_EVERY` and :data:`SILENT_LIMIT`."""

    def __init__(self, connect: Callable[[], Any], invalidate: Callable[[list[str]], None],
                 clear: Callable[[], None], name: str,
                 sweep: Callable[[], None] = lambda: None, *,
                 ping_every: float = PING_EVERY, silent_limit: float = SILENT_LIMIT) -> None:
        self._connect = connect
        self.ping_every = ping_every
        self.silent_limit = silent_limit
        self._sweep = sweep
        self._invalidate = invalidate
        self._clear = clear
        self._name = name
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.ready = False
        self.epoch = 0
        self.client_id: int | None = None
        self.heard = 0.0  # time.monotonic() when the newest answered PING was sent
        self.losses = 0  # channel losses so far (for tests and logs)
        self._conn: Any = None
        self._thread = threading.Thread(target=self._run, name=f"near-cache {name}",
                                        daemon=True)
        self._thread.start()

    def healthy(self, now: float) -> bool:
        return self.ready and now - self.heard < self.silent_limit

    def wait_ready(self, timeout: float) -> bool:
        """Block until the channel is subscribed (for tests and warm-up), up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while not self.ready and time.monotonic() < deadline:
            self._stopped.wait(0.005)
        return self.ready

    def stop(self, join: bool = True) -> None:
        """End the thread (``join``: and wait for it) after losing the channel."""
        self._stopped.set()
        self.lose("stopped")
        conn = self._conn
        if conn is not None:
            conn.disconnect()
        if join:
            self._thread.join(timeout=5)

    def refused(self, epoch: int, exc: BaseException) -> None:
        """A read connection's ``CLIENT TRACKING ... REDIRECT`` was refused in ``epoch``:
        this server does not know the channel's connection (it was killed, or the read
        connections now reach another server). Lose the channel and subscribe again."""
        if epoch == self.epoch:  # else that channel is gone already
            self.renew(f"tracking redirect refused: {exc}")

    def renew(self, why: str) -> None:
        """Lose the channel now and let the thread subscribe again (to the current primary)."""
        self.lose(why)
        conn = self._conn
        if conn is not None:
            conn.disconnect()  # the thread's read fails, and it connects again

    def lose(self, why: str) -> None:
        """The channel is gone: bypass and empty the local store until it is back."""
        with self._lock:
            was_ready = self.ready
            self.ready = False
            self.epoch += 1
            self.client_id = None
            if was_ready:
                self.losses += 1
        self._clear()
        if was_ready and not self._stopped.is_set():
            logger.warning("near cache %s: invalidation channel lost (%s); bypassing the "
                           "local cache until it is back", self._name, why)

    def _run(self) -> None:
        delay = 0.05
        while not self._stopped.is_set():
            epoch = self.epoch
            try:
                self._subscribe_and_read()
            except Exception as exc:
                # RedisError / OSError / ValueError mostly; a close from another thread
                # (renew(), stop()) in the middle of a read can surface as redis-py's parser
                # failing (AttributeError). Whatever it was, the channel is lost, not the
                # thread: it subscribes again.
                self.lose(f"{type(exc).__name__}: {exc}")
            if self.epoch > epoch + 1:  # it had subscribed: retry soon
                delay = 0.05
            conn, self._conn = self._conn, None
            if conn is not None:
                conn.disconnect()
            if self._stopped.wait(delay):
                break
            delay = min(RETRY_MAX, delay * 2)

    def _subscribe_and_read(self) -> None:
        conn = self._conn = self._connect()
        conn.send_command("CLIENT", "ID")
        client_id = int(conn.read_response())
        sent = time.monotonic()  # nothing sent to this new connection before this moment
        conn.send_command("SUBSCRIBE", CHANNEL)
        reply = conn.read_response()
        if not (isinstance(reply, list) and reply[0] in (b"subscribe", "subscribe")):
            raise ValueError(f"unexpected SUBSCRIBE reply {reply!r}")
        with self._lock:
            self.client_id = client_id
            self.epoch += 1
            self.heard = sent
            self.ready = True
        pings: dict[int, float] = {}  # number -> when sent, until answered
        number, last_ping = 0, -self.ping_every
        while not self._stopped.is_set():
            now = time.monotonic()
            if now - self.heard >= self.silent_limit:
                raise ValueError(f"no PING answered within {now - self.heard:.1f} s "
                                 f"({len(pings)} waiting): the channel is silent or lagging")
            if now - last_ping >= self.ping_every:
                number += 1
                pings[number] = last_ping = now
                conn.send_command("PING", number)
            # Asleep until a message arrives or the next PING is due: no idle wake-ups
            # that would take the GIL from the threads serving requests.
            due = last_ping + self.ping_every - time.monotonic()
            if conn.can_read(timeout=max(due, 0.001)):
                message = conn.read_response()
                answered = _pong(message)
                if answered is None:
                    self._handle(message)
                elif answered in pings:
                    self.heard = pings.pop(answered)
                    for older in [n for n in pings if n < answered]:
                        del pings[older]
                    self._sweep()

    def _handle(self, message: Any) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return
        kind, channel, payload = message[0], message[1], message[2]
        if kind not in (b"message", "message") or channel not in (CHANNEL, CHANNEL.decode()):
            return
        if payload is None:  # FLUSHALL / FLUSHDB, or the server dropped its tracking table
            self._clear()
            return
        self._invalidate([k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
                          for k in payload])


def _pong(message: Any) -> int | None:
    """The number of the PING ``message`` answers (RESP2 while subscribed: ``[pong, n]``),
    else ``None``."""
    if (isinstance(message, list) and len(message) == 2
            and message[0] in (b"pong", "pong")):
        try:
            return int(message[1])
        except (TypeError, ValueError):
            return None
    return None
