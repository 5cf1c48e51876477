"""Following a Sentinel failover from the moment the new primary is promoted.

redis-py asks the sentinels for the primary only when it opens a connection. After a
graceful ``SENTINEL FAILOVER`` its pooled connections therefore keep writing to the old
primary, which still accepts writes until Sentinel demotes it about 10 s later; every
write acknowledged in between is then lost (the old primary resyncs from the new one).
The sentinels themselves switch about 1 s after the promotion (the leader notices it at
its next once-a-second ``INFO``).

The clients built here close that window, with a :class:`~.watch.Watch` per service and
process that sees the promotion itself (within about 0.1 s):

* :class:`FollowingSentinel` answers ``discover_master`` with the promoted primary the
  watch pinned, and otherwise ignores a sentinel whose configuration epoch is older than
  one already seen (a sentinel that has not heard of the failover names the old primary);
* :class:`FollowingPool` (and its asyncio twin) notices on its next checkout that the
  watch moved (one integer comparison per command), re-reads the primary, drops its idle
  connections, and never hands out a connection to another address: in-flight commands
  finish where they were sent; every later command goes to the new primary.

After ``fork()`` the listener threads restart in the child on its first checkout.
Without a reachable sentinel Pub/Sub, or when ``ROLE`` is denied to the configured user,
clients fall back to redis-py's own behaviour (the sentinels' answer on a new connection,
and a demoted primary's ``READONLY`` dropping the connection). See
``docs/failure-modes.md``.
"""

from __future__ import annotations

from typing import Any

import redis
import redis.asyncio.sentinel as async_sentinel
import redis.sentinel as sync_sentinel
from redis.asyncio.connection import SSLConnection as AsyncSSLConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from .watch import Address, Watch, watch_for


class _Choice:
    """Picks the primary from the sentinels' answers, asked one by one.

    The first valid answer whose configuration is not older than one already seen wins.
    When every valid answer is older (the sentinels were rebuilt and count epochs anew),
    the newest of them wins: a stale epoch must not lock the process out for good.
    """

    def __init__(self, manager: Any, service: str) -> None:
        self.manager, self.service = manager, service
        self.watch: Watch = manager.watch(service)
        self.watch.ensure_listening()
        self.pinned = self.watch.pinned()  # a promotion the sentinels have not announced
        self.older: list[tuple[int, int, Address]] = []
        self.errors: list[str] = []

    def offer(self, index: int, masters: Any) -> Address | None:
        """Sentinel ``index`` answered ``SENTINEL MASTERS``: the primary, or None."""
        state = masters.get(self.service)
        if not state or not self.manager.check_master_state(state, self.service):
            return None
        address, epoch = (state["ip"], int(state["port"])), int(state.get("config-epoch", 0))
        if not self.watch.accept(epoch, address):
            self.older.append((epoch, index, address))  # has not heard of a newer failover
            return None
        return self._chosen(index, address)

    def result(self) -> Address:
        """When no sentinel gave an answer :meth:`offer` took."""
        if self.pinned is not None:
            return self.pinned
        if not self.older:
            raise sync_sentinel.MasterNotFoundError(
                f"No master found for {self.service!r}"
                + (f" : {', '.join(self.errors)}" if self.errors else ""))
        epoch, index, address = max(self.older)
        self.watch.restart(epoch, address)
        return self._chosen(index, address)

    def _chosen(self, index: int, address: Address) -> Address:
        sentinels = self.manager.sentinels
        sentinels[0], sentinels[index] = sentinels[index], sentinels[0]
        forced = getattr(self.manager, "_force_master_ip", None)
        return (forced, address[1]) if forced is not None else address


class _Watching:
    """The watches of one Sentinel manager, one per service it is asked about."""

    def watch(self, service: str) -> Watch:
        watches: dict[str, Watch] = self.__dict__.setdefault("_watches", {})
        if service not in watches:
            watches[service] = watch_for(self, service)
        return watches[service]


class FollowingSentinel(_Watching, sync_sentinel.Sentinel):
    """A redis-py ``Sentinel`` whose clients follow a failover at once (module docstring)."""

    def discover_master(self, service_name: str) -> Address:
        choice = _Choice(self, service_name)
        for index, sentinel in enumerate([] if choice.pinned else list(self.sentinels)):
            try:
                found = choice.offer(index, sentinel.sentinel_masters())
            except (RedisConnectionError, RedisTimeoutError) as exc:
                choice.errors.append(f"{sentinel} - {exc!r}")
                continue
            if found is not None:
                return found
        return choice.result()

    def master_for(self, service_name: str, redis_class: Any = redis.Redis,
                   connection_pool_class: Any = None, **kwargs: Any) -> Any:
        return super().master_for(service_name, redis_class=redis_class,
                                  connection_pool_class=connection_pool_class or FollowingPool,
                                  **kwargs)

    @classmethod
    def like(cls, manager: Any) -> FollowingSentinel:
        """A following twin of a plain redis-py ``Sentinel`` (same sentinels and options)."""
        hosts = [(c.connection_pool.connection_kwargs["host"],
                  c.connection_pool.connection_kwargs["port"]) for c in manager.sentinels]
        return cls(hosts, min_other_sentinels=manager.min_other_sentinels,
                   sentinel_kwargs=manager.sentinel_kwargs, **manager.connection_kwargs)


class _Following:
    """What both pools add: the watch, and the two questions asked on each checkout."""

    _watch: Watch | None
    _generation: int

    def _start_watching(self, manager: Any, ssl_class: type) -> None:
        pool: Any = self
        self._watch = manager.watch(pool.service_name) if isinstance(manager, _Watching) else None
        if self._watch is not None:
            self._watch.use_probe_options(pool.connection_kwargs,
                                          ssl=issubclass(pool.connection_class, ssl_class))
            self._watch.ensure_listening()
        self._generation = self._watch.generation if self._watch else 0

    def _primary_moved(self) -> bool:
        """True once per move of the primary (the caller then re-reads it)."""
        watch = self._watch
        if watch is None:
            return False
        if not watch.listening:
            watch.ensure_listening()
        if watch.generation == self._generation:
            return False
        self._generation = watch.generation
        return True

    def _points_elsewhere(self, connection: Any) -> bool:
        """True for a connection to another server than the current primary."""
        pool: Any = self
        expected = pool.master_address
        return bool(pool.is_master and expected is not None
                    and (connection.host, connection.port) != tuple(expected))


class FollowingPool(_Following, sync_sentinel.SentinelConnectionPool):
    """A ``SentinelConnectionPool`` that moves to a new primary on its next checkout."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)
        self._start_watching(sentinel_manager, redis.SSLConnection)

    def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._primary_moved():
            self.get_master_address()  # drops idle connections to the old primary
        connection = super().get_connection(*args, **kwargs)
        if self._points_elsewhere(connection):
            try:  # checked out while the primary moved: reconnect to the new one
                connection.disconnect()
                connection.connect()
            except BaseException:
                self.release(connection)
                raise
        return connection


class AsyncFollowingSentinel(_Watching, async_sentinel.Sentinel):
    """Asyncio twin of :class:`FollowingSentinel` (the watch and its threads are shared)."""

    async def discover_master(self, service_name: str) -> Address:
        choice = _Choice(self, service_name)
        for index, sentinel in enumerate([] if choice.pinned else list(self.sentinels)):
            try:
                found = choice.offer(index, await sentinel.sentinel_masters())
            except (RedisConnectionError, RedisTimeoutError) as exc:
                choice.errors.append(f"{sentinel} - {exc!r}")
                continue
            if found is not None:
                return found
        return choice.result()

    def master_for(self, service_name: str, redis_class: Any = None,
                   connection_pool_class: Any = None, **kwargs: Any) -> Any:
        import redis.asyncio

        return super().master_for(
            service_name, redis_class=redis_class or redis.asyncio.Redis,
            connection_pool_class=connection_pool_class or AsyncFollowingPool, **kwargs)


class AsyncFollowingPool(_Following, async_sentinel.SentinelConnectionPool):
    """Asyncio twin of :class:`FollowingPool`."""

    def __init__(self, service_name: str, sentinel_manager: Any, **kwargs: Any) -> None:
        super().__init__(service_name, sentinel_manager, **kwargs)
        self._start_watching(sentinel_manager, AsyncSSLConnection)

    async def get_connection(self, *args: Any, **kwargs: Any) -> Any:
        if self._primary_moved():
            await self.get_master_address()  # drops idle connections to the old primary
        connection = await super().get_connection(*args, **kwargs)
        if self._points_elsewhere(connection):
            try:  # released after the primary moved (asyncio pools keep such connections)
                await connection.disconnect()
                await connection.connect()
            except BaseException:
                await self.release(connection)
                raise
        return connection
