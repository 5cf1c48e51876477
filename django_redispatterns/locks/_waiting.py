"""Waiting for a held lock: blocked on the lock's wake-up list, or a bounded back-off.

One server (or Cluster): a waiter's failed attempt sets the name's "someone waits" marker
(in the acquire script), and the holder's release pushes one element onto the name's
wake-up list (in the release script), so exactly one waiter, in any process, wakes at
once. The waiter blocks with ``BLPOP`` on a connection of its own (not one of the shared
pool's), for at most ``MAX_BLOCK``, its deadline or the holder's remaining lease, then
tries again: a release just before it blocked left the element there (the list lives
``WAKE_TTL_MS``), and a wake-up that never comes (the holder crashed, the marker expired)
costs at most one bound. Quorum mode: the jittered back-off, cut short by releases in this
process (a wake-up list on a minority of masters would promise nothing).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
import weakref
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from .. import connection
from ..connection.build import without_resend
from ._lease import WAITING_MS, WAKE_TTL_MS, Attempt, Server

MIN_DELAY = 0.005  # first back-off step while waiting (seconds)
MAX_DELAY = 0.2  # back-off cap: a waiter asks Redis at most ~5 times a second
MAX_BLOCK = 1.0  # longest single BLPOP (a waiter keeps its place in the queue that long)


class Wakeups:
    """Per-key wake-ups for waiters in this process: a release wakes one waiter of its key.

    Waking one (not all) avoids a herd of attempts of which all but one must fail; the rest
    keep their back-off timers, so a missed or wasted wake-up costs at most one back-off step.
    """

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.waiting: dict[str, list[Any]] = {}  # key -> [Condition, waiters]
        self.releases: dict[str, int] = {}

    def generation(self, key: str) -> int:
        return self.releases.get(key, 0)

    def notify(self, keys: Sequence[str]) -> None:
        if not self.waiting:  # the common, uncontended case takes no lock
            return
        with self.mutex:
            for key in keys:
                self.releases[key] = self.releases.get(key, 0) + 1
                entry = self.waiting.get(key)
                if entry is not None:
                    with entry[0]:
                        entry[0].notify()

    def sleep(self, key: str, seconds: float, generation: int) -> None:
        with self.mutex:
            entry = self.waiting.setdefault(key, [threading.Condition(), 0])
            entry[1] += 1
            condition = entry[0]
        try:
            with condition:
                if self.releases.get(key, 0) == generation:
                    condition.wait(seconds)
        finally:
            with self.mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.waiting[key]
                    self.releases.pop(key, None)


wakeups = Wakeups()


def backoff(attempt: Attempt, delay: float, remaining: float) -> float:
    """Full jitter spreads waiters; never sleep past our deadline or the holder's lease."""
    pause = random.uniform(delay / 2, delay)
    if attempt.holder_pttl > 0:
        pause = min(pause, attempt.holder_pttl / 1000 + 0.001)
    return max(0.0, min(pause, remaining))


# --- the dedicated blocking connections -----------------------------------------------
# One client per pool of the lock's client (per Cluster node), over a pool of its own with
# the same connection options, so a blocked waiter never holds a shared pool's connection.

_blocking: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_blocking_mutex = threading.Lock()


def _blocking_client(client: Any, key: str) -> Any:
    base = client.get_node_from_key(key).redis_connection if connection.is_cluster(
        client) else client
    pool = base.connection_pool
    dedicated = _blocking.get(pool)
    if dedicated is None:
        with _blocking_mutex:
            dedicated = _blocking.get(pool)
            if dedicated is None:
                dedicated = _blocking[pool] = without_resend(base)
    return dedicated


def _async_blocking_client(client: Any) -> Any:
    pool = client.connection_pool
    if type(pool) is not redis.asyncio.ConnectionPool:  # Sentinel: share the client's pool
        return client
    dedicated = _blocking.get(pool)
    if dedicated is None:
        own = redis.asyncio.ConnectionPool(connection_class=pool.connection_class,
                                           max_connections=pool.max_connections,
                                           **pool.connection_kwargs)
        dedicated = _blocking[pool] = redis.asyncio.Redis(connection_pool=own)
    return dedicated


def _cap(client: Any) -> float:
    """MAX_BLOCK, or less when the client's socket timeout would fire first."""
    timeout = client.connection_pool.connection_kwargs.get("socket_timeout")
    return MAX_BLOCK if not timeout else max(0.001, min(MAX_BLOCK, float(timeout) - 0.05))


class Waiter:
    """The state of one acquire that may wait: its deadline and how it waits."""

    def __init__(self, store: Server, held_keys: Sequence[str], wait: float) -> None:
        self.store = store
        self.held_keys = held_keys
        self.started = time.monotonic()
        self.deadline = self.started + wait
        self.slept = False  # at least one wait: the lock was held when asked
        self.delay = MIN_DELAY
        self.generations: list[int] = []
        self.woken = 0  # 1-based index of the name whose wake-up the last block consumed
        self.blocks = wait > 0 and store.wakes_waiters
        self.backs_off = wait > 0 and not store.wakes_waiters

    def acquire_call(self, keys_: list[str], args: list[Any]) -> tuple[list[str], list[Any]]:
        """The acquire script's keys and arguments; a blocking waiter adds its markers."""
        if not self.blocks:
            return keys_, args
        target = self.store.target
        if len(target.names) == 1:  # woken: may take the lock its release handed over
            return target.waiter_keys, [*args, WAITING_MS, self.woken]
        # Several names: a wake-up consumed for one name is passed on when this attempt
        # fails on another one (the script pushes it again if that name is free).
        return target.waiter_keys, [*args, WAITING_MS, self.woken, WAKE_TTL_MS]

    def before_attempt(self) -> None:
        """Note the release count of each key, so a release during the attempt is not missed."""
        if self.backs_off:
            self.generations = [wakeups.generation(k) for k in self.held_keys]

    def _remaining(self) -> float | None:
        remaining = self.deadline - time.monotonic()
        if remaining <= 0:
            return None
        self.slept = True
        return remaining

    def _pause(self, attempt: Attempt, remaining: float) -> float:
        pause = backoff(attempt, self.delay, remaining)
        self.delay = min(self.delay * 2, MAX_DELAY)
        return pause

    def _bound(self, attempt: Attempt, remaining: float, cap: float) -> float:
        bound = min(remaining, cap)
        if attempt.holder_pttl > 0:
            bound = min(bound, attempt.holder_pttl / 1000 + 0.001)
        return bound

    def _wake_key(self, attempt: Attempt) -> str:
        return self.store.target.wake_keys[max(0, attempt.conflict - 1)]

    def sleep(self, attempt: Attempt) -> bool:
        """Wait before the next attempt; False when the deadline has passed (give up)."""
        remaining = self._remaining()
        if remaining is None:
            return False
        i = max(0, attempt.conflict - 1)
        if not self.blocks:
            wakeups.sleep(self.held_keys[i], self._pause(attempt, remaining),
                          self.generations[i] if self.generations else 0)
            return True
        key = self._wake_key(attempt)
        self.woken = 0
        try:
            client = _blocking_client(self.store.clients()[0], key)
            bound = self._bound(attempt, remaining, _cap(client))
            if bound >= 0.001 and client.blpop([key], timeout=bound) is not None:
                self.woken = i + 1
        except redis.RedisError:  # never fail while waiting: the next attempt will tell
            time.sleep(self._pause(attempt, remaining))
        return True

    async def asleep(self, attempt: Attempt) -> bool:
        """Async twin of :meth:`sleep` (Cluster: the back-off only)."""
        remaining = self._remaining()
        if remaining is None:
            return False
        client = self.store.async_clients()[0]
        if not self.blocks or connection.is_cluster(client):
            await asyncio.sleep(self._pause(attempt, remaining))
            return True
        key = self._wake_key(attempt)
        self.woken = 0
        try:
            blocking = _async_blocking_client(client)
            bound = self._bound(attempt, remaining, _cap(blocking))
            if bound >= 0.001 and await blocking.blpop([key], timeout=bound) is not None:
                self.woken = max(0, attempt.conflict - 1) + 1
        except redis.RedisError:
            await asyncio.sleep(self._pause(attempt, remaining))
        return True
