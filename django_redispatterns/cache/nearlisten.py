"""The near cache's invalidation channel: one connection and one thread per cache, per process.

The thread keeps a RESP2 connection subscribed to ``__redis__:invalidate``. Redis sends
there the names of keys that the near cache's read connections fetched and somebody
(any client) then changed, expired, evicted or flushed — because each read connection
runs ``CLIENT TRACKING on REDIRECT <this connection's id>`` (:func:`tracked_class`).

The channel is *healthy* while it is subscribed and has heard from Redis (a message or
the answer to a PING sent every :data:`PING_EVERY` seconds) within :data:`SILENT_LIMIT`
seconds. Whenever it stops being healthy — the connection dropped or was killed, the
server restarted or failed over, or it went silent — :meth:`Listener.lose` empties the
local store and the near cache is bypassed until the thread has subscribed again.
Every (re)subscription starts a new *epoch*; a read connection set up for another epoch
enables tracking again before its value may be stored.
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
import redis.asyncio
from redis.exceptions import RedisError

logger = logging.getLogger("django_redispatterns.cache")


def _checkout_args(get_connection: Callable[..., Any]) -> tuple[str, ...]:
    """What a pool's ``get_connection`` needs: redis-py before 5.1 requires a command name
    (unused by the pool), later versions deprecate passing one."""
    parameter = inspect.signature(get_connection).parameters.get("command_name")
    needed = parameter is not None and parameter.default is inspect.Parameter.empty
    return ("GET",) if needed else ()


#: The arguments of a sync / asyncio pool checkout on the installed redis-py.
CHECKOUT = _checkout_args(redis.ConnectionPool.get_connection)
ACHECKOUT = _checkout_args(redis.asyncio.ConnectionPool.get_connection)

CHANNEL = b"__redis__:invalidate"
PING_EVERY = 1.0  # seconds between PINGs when nothing else arrives
SILENT_LIMIT = 3.0  # seconds without a word from Redis before the channel counts as lost
RETRY_MAX = 1.0  # longest wait between reconnection attempts


@functools.cache
def tracked_class(base: type, aio: bool = False) -> type:
    """``base`` (a redis-py connection class; ``aio``: a redis.asyncio one) whose every
    (re)connect forgets its tracking setup, so a value read on a fresh socket is stored
    only after tracking is enabled on it."""

    def on_connect(self: Any) -> None:
        self.rp_epoch = None
        base.on_connect(self)  # type: ignore[attr-defined]

    async def aon_connect(self: Any) -> None:
        self.rp_epoch = None
        await base.on_connect(self)  # type: ignore[attr-defined]

    return type(f"NearTracked{base.__name__}", (base,),
                {"on_connect": aon_connect if aio else on_connect, "rp_epoch": None})


class Listener:
    """The background thread reading invalidations for one local store.

    ``invalidate(nkeys)`` and ``clear()`` are the store's; ``connect()`` returns a new,
    connected redis-py connection to the cache's primary."""

    def __init__(self, connect: Callable[[], Any], invalidate: Callable[[list[str]], None],
                 clear: Callable[[], None], name: str) -> None:
        self._connect = connect
        self._invalidate = invalidate
        self._clear = clear
        self._name = name
        self._lock = threading.Lock()
        self._stopped = threading.Event()
        self.ready = False
        self.epoch = 0
        self.client_id: int | None = None
        self.heard = 0.0  # time.monotonic() of the last word from Redis
        self.losses = 0  # channel losses so far (for tests and logs)
        self._conn: Any = None
        self._thread = threading.Thread(target=self._run, name=f"near-cache {name}",
                                        daemon=True)
        self._thread.start()

    def healthy(self, now: float) -> bool:
        return self.ready and now - self.heard < SILENT_LIMIT

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
            try:
                self._subscribe_and_read()
            except (RedisError, OSError, ValueError) as exc:
                self.lose(f"{type(exc).__name__}: {exc}")
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
        conn.send_command("SUBSCRIBE", CHANNEL)
        reply = conn.read_response()
        if not (isinstance(reply, list) and reply[0] in (b"subscribe", "subscribe")):
            raise ValueError(f"unexpected SUBSCRIBE reply {reply!r}")
        with self._lock:
            self.client_id = client_id
            self.epoch += 1
            self.heard = time.monotonic()
            self.ready = True
        last_ping = time.monotonic()
        while not self._stopped.is_set():
            if conn.can_read(timeout=PING_EVERY / 4):
                self._handle(conn.read_response())
                self.heard = time.monotonic()
                continue
            now = time.monotonic()
            if now - self.heard >= SILENT_LIMIT:
                raise ValueError(f"no word from Redis for {now - self.heard:.1f} s")
            if now - last_ping >= PING_EVERY:
                conn.send_command("PING")
                last_ping = now

    def _handle(self, message: Any) -> None:
        if not isinstance(message, list) or len(message) < 3:
            return  # a PING's answer: only proof of life
        kind, channel, payload = message[0], message[1], message[2]
        if kind not in (b"message", "message") or channel not in (CHANNEL, CHANNEL.decode()):
            return
        if payload is None:  # FLUSHALL / FLUSHDB, or the server dropped its tracking table
            self._clear()
            return
        self._invalidate([k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k)
                          for k in payload])
