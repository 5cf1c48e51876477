"""What one process knows about a Sentinel-managed primary, kept current by listening.

A :class:`Watch` per service and process subscribes to every sentinel (one daemon thread
each). When the leader announces that it sent ``REPLICAOF NO ONE``
(``+failover-state-wait-promotion``), the watch asks that replica for its ``ROLE`` every
:data:`PROBE_INTERVAL` seconds, for at most :data:`PROBE_WINDOW` seconds (a bounded poll,
only while a promotion is under way), and *pins* it as the primary the moment it answers
``master``. ``+switch-master`` (and every reconnection to a sentinel) reads the sentinels'
configuration with its epoch, which confirms or replaces the pin; ``-failover-abort-*``
drops it, and so does :data:`PIN_SECONDS` without a confirmation. ``generation`` changes
whenever the primary to write to changes; the pools of :mod:`.sentinel` compare it on
each checkout.
"""

from __future__ import annotations

import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Iterable
from typing import Any

import redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

logger = logging.getLogger("django_redispatterns.connection")

#: Seconds between two ``ROLE`` probes of a replica that is being promoted.
PROBE_INTERVAL = 0.02
#: The longest a promotion is waited for once the leader announced it (seconds).
PROBE_WINDOW = 5.0
#: How long a promotion seen by the probe is trusted before the sentinels confirm it.
PIN_SECONDS = 30.0
#: Seconds between two health checks of a sentinel a listener is subscribed to.
PING_INTERVAL = 5.0
#: Bounds of the jittered back-off before a listener reconnects to a sentinel.
RECONNECT_MIN, RECONNECT_MAX = 0.5, 5.0

Address = tuple[str, int]

# Connection options a ROLE probe of a data node shares with the pool's connections.
_PROBE_OPTIONS = ("username", "password", "credential_provider", "protocol",
                  "socket_connect_timeout", "socket_timeout", "client_name")
_CHANNELS = ("+switch-master", "+failover-state-wait-promotion")
_ABORTS = "-failover-abort-*"


class Watch:
    """What this process knows about one Sentinel-managed service's primary.

    ``generation`` changes whenever the primary this process should write to changes;
    pools compare it on each checkout. Thread-safe; listeners keep it current.
    """

    def __init__(self, service: str, sentinels: Iterable[Address],
                 sentinel_kwargs: dict[str, Any]) -> None:
        self.service = service
        self.sentinels = tuple(sentinels)
        # For the listeners' own sync clients: an asyncio manager's objects (redis-py 8.2+
        # puts its asyncio Retry here) would make every call a coroutine never awaited.
        self.sentinel_kwargs = {name: value for name, value in sentinel_kwargs.items()
                                if not type(value).__module__.startswith("redis.asyncio")}
        self.probe_kwargs: dict[str, Any] | None = None
        self.generation = 0
        self.listening = False
        self._lock = threading.Lock()
        self._epoch = -1
        self._current: Address | None = None
        # (address, monotonic deadline, the configuration epoch it replaces)
        self._pin: tuple[Address, float, int] | None = None

    # --- what pools and managers ask --------------------------------------------------

    def pinned(self) -> Address | None:
        """The promoted primary the sentinels have not confirmed yet, if any."""
        pin = self._pin
        if pin is None:
            return None
        if time.monotonic() < pin[1]:
            return pin[0]
        with self._lock:
            if self._pin is pin:
                logger.warning("Sentinel service %r: promotion of %s:%s was not confirmed "
                               "in %.0f s; asking the sentinels again", self.service,
                               *pin[0], PIN_SECONDS)
                self._pin = None
                self.generation += 1
        return None

    def accept(self, epoch: int, address: Address) -> bool:
        """A sentinel names ``address`` at configuration ``epoch``: False when that
        configuration is older than what this process knows (the sentinel lags behind a
        failover another sentinel reported, or behind a promotion the probe saw)."""
        with self._lock:
            if epoch < self._epoch:
                return False
            if self._pin is not None:
                address_pinned, _deadline, pinned_at_epoch = self._pin
                if epoch <= pinned_at_epoch:
                    return address == address_pinned
                self._pin = None  # the sentinels' newer configuration confirms or replaces it
            self._epoch = epoch
            self._move(address)
            return True

    def restart(self, epoch: int, address: Address) -> None:
        """Every sentinel counts configurations from an older epoch: they were rebuilt."""
        with self._lock:
            logger.warning("Sentinel service %r: the sentinels report configuration epoch %d "
                           "after %d; following them", self.service, epoch, self._epoch)
            self._epoch, self._pin = epoch, None
            self._move(address)

    def use_probe_options(self, connection_kwargs: dict[str, Any], ssl: bool) -> None:
        """The options a ``ROLE`` probe of a data node needs (the first pool's win)."""
        if self.probe_kwargs is None:
            options = {k: v for k, v in connection_kwargs.items()
                       if k in _PROBE_OPTIONS or k.startswith("ssl_")}
            self.probe_kwargs = {**options, "ssl": ssl} if ssl else options

    # --- what listeners report ----------------------------------------------------------

    def promoted(self, address: Address) -> None:
        with self._lock:
            self._pin = (address, time.monotonic() + PIN_SECONDS, self._epoch)
            self._move(address)
        logger.info("Sentinel service %r: %s:%s was promoted; writing there now",
                    self.service, *address)

    def aborted(self) -> None:
        with self._lock:
            if self._pin is None:
                return
            self._pin = None
            self._current = None
            self.generation += 1
        logger.warning("Sentinel service %r: failover aborted; asking the sentinels again",
                       self.service)

    def _move(self, address: Address) -> None:
        if self._current is not None and self._current != address:
            self.generation += 1
        self._current = address

    # --- listening ----------------------------------------------------------------------

    def ensure_listening(self) -> None:
        """Start one listener thread per sentinel (again after a fork)."""
        if self.listening:
            return
        with self._lock:
            if self.listening:
                return
            self.listening = True
            ref = weakref.ref(self)
            for host, port in self.sentinels:
                threading.Thread(target=_listen, args=(ref, host, port), daemon=True,
                                 name=f"sentinel-watch-{self.service}-{host}:{port}").start()


def _listen(ref: weakref.ref[Watch], host: str, port: int) -> None:
    """One sentinel's events, for as long as the watch exists in this process."""
    pid = os.getpid()
    delay = RECONNECT_MIN
    while True:
        watch = ref()
        if watch is None or os.getpid() != pid:
            return
        client = redis.Redis(host, port, **watch.sentinel_kwargs)
        del watch
        try:
            _follow_events(ref, client, pid)
            delay = RECONNECT_MIN
        except (redis.RedisError, OSError) as exc:
            logger.debug("Sentinel %s:%s: listener disconnected (%s)", host, port, exc)
        finally:
            client.close()
        time.sleep(random.uniform(delay / 2, delay))  # back-off after a failed connection
        delay = min(RECONNECT_MAX, delay * 2)


def _follow_events(ref: weakref.ref[Watch], client: Any, pid: int) -> None:
    pubsub = client.pubsub()
    try:
        pubsub.subscribe(*_CHANNELS)
        pubsub.psubscribe(_ABORTS)
        watch = ref()
        if watch is None:
            return
        _catch_up(watch, client)  # what happened while this listener was not connected
        del watch
        next_ping = time.monotonic() + PING_INTERVAL
        while os.getpid() == pid:
            message = pubsub.get_message(timeout=1.0)
            watch = ref()
            if watch is None:
                return
            if message and message.get("type") in ("message", "pmessage"):
                _handle(watch, client, _text(message["channel"]), _text(message["data"]))
            del watch
            if time.monotonic() >= next_ping:
                client.ping()  # a hung sentinel: the socket timeout ends this listener
                next_ping = time.monotonic() + PING_INTERVAL
    finally:
        pubsub.close()


def _handle(watch: Watch, client: Any, channel: str, data: str) -> None:
    words = data.split()
    if channel == "+switch-master":  # "<service> <old ip> <old port> <new ip> <new port>"
        service = words[0] if words else ""
    elif "@" in words:  # "slave <ip>:<port> <ip> <port> @ <service> <master ip> <port>"
        service = words[words.index("@") + 1]
    elif len(words) > 1 and words[0] == "master":  # "master <service> <ip> <port>"
        service = words[1]
    else:
        return
    if service != watch.service:
        return
    if channel == "+switch-master":
        _catch_up(watch, client)  # read the new configuration with its epoch
    elif channel == "+failover-state-wait-promotion":
        _await_promotion(watch, (words[2], int(words[3])))
    elif channel.startswith("-failover-abort"):
        watch.aborted()


def _catch_up(watch: Watch, client: Any) -> None:
    state = client.sentinel_master(watch.service)
    if state.get("is_master") and not state.get("is_odown"):
        watch.accept(int(state.get("config-epoch", 0)), (state["ip"], int(state["port"])))


def _await_promotion(watch: Watch, candidate: Address) -> None:
    """Probe ``candidate``'s role until it is a primary (bounded by :data:`PROBE_WINDOW`)."""
    probe = redis.Redis(*candidate, single_connection_client=True,
                        **(watch.probe_kwargs or {"socket_timeout": 1.0,
                                                  "socket_connect_timeout": 1.0}))
    deadline = time.monotonic() + PROBE_WINDOW
    try:
        while time.monotonic() < deadline:
            try:
                role = probe.execute_command("ROLE")
            except redis.ResponseError as exc:  # ROLE denied: the sentinels will tell
                logger.debug("Sentinel service %r: cannot probe %s:%s (%s)",
                             watch.service, *candidate, exc)
                return
            if _text(role[0]) == "master":
                watch.promoted(candidate)
                return
            # Bounded poll (PROBE_WINDOW) while the leader promotes this replica.
            time.sleep(PROBE_INTERVAL)
    except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
        logger.debug("Sentinel service %r: probe of %s:%s failed (%s)", watch.service,
                     *candidate, exc)
    finally:
        probe.close()


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# --- the watches of this process ------------------------------------------------------

_watches: weakref.WeakValueDictionary[tuple[Any, ...], Watch] = weakref.WeakValueDictionary()
_watches_lock = threading.Lock()


def watch_for(manager: Any, service: str) -> Watch:
    """The process's :class:`Watch` of ``service`` behind ``manager``'s sentinels."""
    addresses = tuple(sorted(
        (c.connection_pool.connection_kwargs["host"], int(c.connection_pool.connection_kwargs[
            "port"])) for c in manager.sentinels))
    key = (service, addresses)
    with _watches_lock:
        watch = _watches.get(key)
        if watch is None:
            watch = _watches[key] = Watch(service, addresses, manager.sentinel_kwargs)
    return watch


def _after_fork_in_child() -> None:
    for watch in list(_watches.values()):
        watch.listening = False  # threads do not survive fork(); restart on first use


os.register_at_fork(after_in_child=_after_fork_in_child)


