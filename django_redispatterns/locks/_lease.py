"""One Redis server: the acquire script (SET NX PX + fencing token), owner-checked
release/extend, and the optional ``WAIT`` for replicas. Sync and asyncio.

A :class:`Server` knows the keys of one lock (a :class:`Target`) and nothing of the lock
object itself; :mod:`._quorum` extends it to several independent masters.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import NoScriptError

from .. import connection, scripts
from . import _errors
from ._names import ms

ACQUIRE = "lock_acquire"
RELEASE = "lock_release"
ACQUIRE_ONE = "lock_acquire_one"  # the same protocol for one name: no loops, integer replies
RELEASE_ONE = "lock_release_one"
EXTEND = "lock_extend"
FENCE_FLOOR = "lock_fence_floor"
WAKE_TTL_MS = 1000  # a wake-up list outlives the release that pushed it by this long
WAITING_MS = 2000  # a waiter's "someone waits" marker: longer than its longest block
# A release that wakes a waiter hands the lock over to it for this long: among waiters only
# one that took a wake-up (or a caller that does not wait) may acquire it, so the releaser or
# a waiting newcomer cannot overtake the waiter just woken; one that died costs at most this.
HANDOFF_MS = 100


@dataclass
class Attempt:
    """The outcome of one acquire attempt."""

    ok: bool
    fences: list[int]
    holder_pttl: int = -1  # when not ok: the holder's remaining lease in ms (-1 unknown)
    conflict: int = 0  # when not ok: 1-based index of the name someone else holds
    validity: float = 0.0  # when ok: seconds the lease is known to last from ``started``
    started: float = 0.0  # time.monotonic() when the attempt was sent


def parse_acquire(reply: Any) -> Attempt:
    if isinstance(reply, int):  # lock_acquire_one: the fence, or -1 - the holder's pttl
        if reply > 0:
            return Attempt(True, [reply])
        return Attempt(False, [], holder_pttl=-1 - reply, conflict=1)
    if int(reply[0]) == 1:
        return Attempt(True, [int(f) for f in reply[1:]])
    return Attempt(False, [], holder_pttl=int(reply[2]), conflict=int(reply[1]))


@dataclass
class Target:
    """What the round trips of one lock need: its keys, where they live, its options."""

    label: str
    names: tuple[str, ...]
    held_keys: list[str]
    fence_keys: list[str]
    connections: list[str]
    fencing_ttl_ms: int
    min_replicas: int = 0
    replica_timeout: float = 0.1
    waiting_keys: list[str] = field(default_factory=list)
    wake_keys: list[str] = field(default_factory=list)
    # Built once (a Target is cached with its lock's options), read on every acquire/release:
    acquire_script: str = field(init=False)
    release_script: str = field(init=False)
    acquire_keys: list[str] = field(init=False)  # held + fence keys
    waiter_keys: list[str] = field(init=False)  # + markers (+ wake-up lists: several names)
    release_keys: list[str] = field(init=False)  # held + waiting markers + wake-up lists

    def __post_init__(self) -> None:
        one = len(self.names) == 1
        self.acquire_script = ACQUIRE_ONE if one else ACQUIRE
        self.release_script = RELEASE_ONE if one else RELEASE
        self.acquire_keys = self.held_keys + self.fence_keys
        self.waiter_keys = self.acquire_keys + self.waiting_keys + ([] if one else self.wake_keys)
        self.release_keys = self.held_keys + self.waiting_keys + self.wake_keys


class Server:
    """The lease of one lock on one Redis server (or one Cluster slot)."""

    quorum_mode = False
    wakes_waiters = True  # a release pushes a wake-up for waiters in other processes

    def __init__(self, target: Target) -> None:
        self.target = target
        self.acked = 0  # replicas that acknowledged the last acquire (min_replicas)
        self._sync_clients: list[Any] | None = None

    # -- clients -----------------------------------------------------------------------

    def clients(self) -> list[Any]:
        if self._sync_clients is None:
            self._sync_clients = [connection.client_for(c) for c in self.target.connections]
        return self._sync_clients

    def async_clients(self) -> list[Any]:
        return [connection.async_client_for(c) for c in self.target.connections]

    def majority(self) -> int:
        return len(self.target.connections) // 2 + 1

    def unavailable(self, action: str, exc: BaseException) -> Exception:
        return _errors.unavailable(self.target.label, action, exc)

    # -- acquire -----------------------------------------------------------------------

    def _sender(self) -> Callable[..., Any]:
        if self.target.min_replicas:
            return self._acquire_and_wait
        return scripts.script(self.target.acquire_script)

    def attempt(self, token: str, keys_: list[str], args: list[Any], ttl: float) -> Attempt:
        """One acquire round trip; raises BackendUnavailable (fail closed)."""
        client = self.clients()[0]
        send = self._sender()
        started = time.monotonic()
        try:
            try:
                reply = send(client, keys_, args)
            except redis.TimeoutError:
                # The script may have run and only the reply was lost. Re-sending it with
                # the same token is safe: a key already holding our token counts as ours.
                reply = send(client, keys_, args)
        except redis.RedisError as exc:
            self.release_quietly(token)
            raise self.unavailable("acquire", exc) from exc
        return self._settled(token, parse_acquire(reply), started, ttl)

    def _settled(self, token: str, attempt: Attempt, started: float, ttl: float) -> Attempt:
        if attempt.ok and self.target.min_replicas and self.acked < self.target.min_replicas:
            self.release_quietly(token)
            raise self._replicas_error()
        attempt.validity, attempt.started = ttl, started
        return attempt

    async def aattempt(self, token: str, keys_: list[str], args: list[Any],
                       ttl: float) -> Attempt:
        """Async twin of :meth:`attempt`."""
        client = self.async_clients()[0]
        send = self._aacquire_and_wait if self.target.min_replicas else scripts.script(
            self.target.acquire_script).acall
        started = time.monotonic()
        try:
            try:
                reply = await send(client, keys_, args)
            except redis.TimeoutError:  # as in attempt()
                reply = await send(client, keys_, args)
        except redis.RedisError as exc:
            await self.arelease_quietly(token)
            raise self.unavailable("acquire", exc) from exc
        attempt = parse_acquire(reply)
        if attempt.ok and self.target.min_replicas and self.acked < self.target.min_replicas:
            await self.arelease_quietly(token)
            raise self._replicas_error()
        attempt.validity, attempt.started = ttl, started
        return attempt

    def _replicas_error(self) -> Exception:
        t = self.target
        return self.unavailable("acquire", RuntimeError(
            f"{self.acked} of {t.min_replicas} replicas acknowledged the lock within "
            f"{t.replica_timeout:g}s; released it rather than risk losing it on failover"))

    def _acquire_pipe(self, client: Any, command: str, keys_: list[str], args: list[Any]) -> Any:
        lua = scripts.script(self.target.acquire_script)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, lua.sha if command == "EVALSHA" else lua.source,
                             len(keys_), *keys_, *args)
        pipe.execute_command("WAIT", self.target.min_replicas, ms(self.target.replica_timeout))
        return pipe

    def _waited(self, results: list[Any]) -> Any:
        """The script's reply from [reply, WAIT count]; None when NOSCRIPT (it did not run)."""
        reply, acked = results
        if isinstance(reply, NoScriptError):
            return None
        for result in (reply, acked):
            if isinstance(result, Exception):
                raise result
        self.acked = int(acked)
        return reply

    def _acquire_and_wait(self, client: Any, keys_: list[str], args: list[Any]) -> Any:
        """The acquire script, then ``WAIT`` on the same connection: one round trip."""
        if connection.is_cluster(client):
            raise ValueError("min_replicas needs a single-master client (WAIT is per "
                             "connection); it is not supported on Redis Cluster")
        for command in ("EVALSHA", "EVAL"):  # EVAL only after NOSCRIPT
            reply = self._waited(
                self._acquire_pipe(client, command, keys_, args).execute(raise_on_error=False))
            if reply is not None:
                return reply
        raise NoScriptError("script cache lost twice in a row")

    async def _aacquire_and_wait(self, client: Any, keys_: list[str], args: list[Any]) -> Any:
        """Async twin of :meth:`_acquire_and_wait`."""
        for command in ("EVALSHA", "EVAL"):
            pipe = self._acquire_pipe(client, command, keys_, args)
            reply = self._waited(await pipe.execute(raise_on_error=False))
            if reply is not None:
                return reply
        raise NoScriptError("script cache lost twice in a row")

    # -- release / extend --------------------------------------------------------------

    def release_quietly(self, token: str) -> None:
        """Undo a (possibly partial) acquire; errors are ignored (the lease ends anyway)."""
        for client in self.clients():
            with contextlib.suppress(redis.RedisError):
                scripts.script(self.target.release_script)(client, self.target.held_keys,
                                                           [token])

    async def arelease_quietly(self, token: str) -> None:
        for client in self.async_clients():
            with contextlib.suppress(redis.RedisError):
                await scripts.script(self.target.release_script).acall(
                    client, self.target.held_keys, [token])

    def _release_call(self, token: str) -> tuple[list[str], list[Any]]:
        t = self.target
        if not self.wakes_waiters:
            return t.held_keys, [token]
        return t.release_keys, [token, WAKE_TTL_MS, HANDOFF_MS]

    def release(self, token: str) -> int:
        """Owner-checked release that wakes one waiter of each name; names released."""
        keys_, args = self._release_call(token)
        return self.count(self.target.release_script, args, "release", keys_)

    async def arelease(self, token: str) -> int:
        """Async twin of :meth:`release`."""
        keys_, args = self._release_call(token)
        return await self.acount(self.target.release_script, args, "release", keys_)

    def count(self, script: str, args: list[Any], action: str,
              keys_: list[str] | None = None) -> int:
        """Run release/extend on every connection; the number of names still ours."""
        lua = scripts.script(script)
        keys_ = self.target.held_keys if keys_ is None else keys_
        results: list[int] = []
        error: Exception | None = None
        for client in self.clients():
            try:
                results.append(int(lua(client, keys_, args)))
            except redis.RedisError as exc:
                error = exc
        return self.count_result(results, error, action)

    async def acount(self, script: str, args: list[Any], action: str,
                     keys_: list[str] | None = None) -> int:
        """Async twin of :meth:`count`."""
        lua = scripts.script(script)
        keys_ = self.target.held_keys if keys_ is None else keys_
        replies = await asyncio.gather(
            *(lua.acall(c, keys_, args) for c in self.async_clients()),
            return_exceptions=True,
        )
        results = [int(r) for r in replies if not isinstance(r, BaseException)]
        errors = [r for r in replies if isinstance(r, redis.RedisError)]
        others = [r for r in replies if isinstance(r, BaseException)
                  and not isinstance(r, redis.RedisError)]
        if others:
            raise others[0]
        return self.count_result(results, errors[0] if errors else None, action)

    def count_result(self, results: list[int], error: Exception | None, action: str) -> int:
        if error is not None:
            raise self.unavailable(action, error)
        return results[0]

    def owned(self, token: str) -> bool:
        """True when Redis still holds ``token`` for every name (one read per server)."""
        mine = (token + "|").encode()
        votes = 0
        try:
            for client in self.clients():
                try:
                    values = client.mget(self.target.held_keys)
                except redis.RedisError:
                    if not self.quorum_mode:
                        raise
                    continue
                votes += all(v is not None and bytes(v).startswith(mine) for v in values)
        except redis.RedisError as exc:
            raise self.unavailable("check", exc) from exc
        return votes >= self.majority()
