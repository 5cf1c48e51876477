"""Lua scripts: found in the top-level ``lua/`` folder, loaded once, called by SHA.

Each ``lua/<name>.lua`` becomes one :class:`LuaScript`, created once per process.
Calls go out as ``EVALSHA``; when the server answers ``NOSCRIPT`` (after a restart, a
failover or ``SCRIPT FLUSH``) the same call is sent once as ``EVAL``, which both runs
and caches the script. ``NOSCRIPT`` means the script did not run, so this fallback can
never execute a script twice.

On Redis Cluster a call can also be *rejected before it runs*: ``TRYAGAIN`` while the
slot of its keys is being migrated (keys split between two nodes), ``CLUSTERDOWN`` while
a failed master is being replaced. redis-py follows ``MOVED``/``ASK`` itself and gives up
on ``TRYAGAIN`` after ~0.4 s; such rejected calls are re-sent here with jittered
exponential back-off for up to :func:`rejection_budget` seconds, then
:class:`~django_redispatterns.exceptions.ClusterUnavailable` is raised. This is safe for
every script, idempotent or not, because a rejected script never ran. Timeouts and
connection errors are *not* retried here (the script may have run; no silent duplicate writes).

In an installed wheel the scripts live in ``django_redispatterns/lua/`` (force-included
by the build); in a checkout or editable install they are read from ``<repo>/lua/``.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import random
import time
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import (
    ClusterDownError,
    ClusterError,
    NoScriptError,
    SlotNotCoveredError,
    TryAgainError,
)

from .exceptions import ClusterUnavailable

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python >= 3.11; only for typing

KeyT = str | bytes
ArgT = str | bytes | int | float

logger = logging.getLogger("django_redispatterns.scripts")

#: The longest a script rejected by Redis Cluster (TRYAGAIN, CLUSTERDOWN) is re-sent.
REJECTION_RETRY_SECONDS = 2.0


def rejection_budget() -> float:
    """Seconds a rejected script is re-sent: ``REDIS_PATTERNS["SOCKET_TIMEOUT"]`` (the bound
    on any decision), at most :data:`REJECTION_RETRY_SECONDS`, at least 0.1 s."""
    from .conf import get_config

    return min(REJECTION_RETRY_SECONDS, max(0.1, float(get_config()["SOCKET_TIMEOUT"])))


def rejected_before_running(exc: BaseException) -> bool:
    """True when Redis Cluster refused the call without running it (safe to re-send)."""
    if isinstance(exc, (TryAgainError, ClusterDownError, SlotNotCoveredError)):
        return True
    # redis-py's "TTL exhausted": it followed MOVED/ASK/TRYAGAIN until it gave up.
    return type(exc) is ClusterError


class _Backoff:
    """Jittered exponential back-off (20 ms doubling, capped at 500 ms) under a deadline.

    Not busy polling: each wait follows a rejection from the server, and the total is
    bounded by :func:`rejection_budget`.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.attempt = 0
        self.budget = rejection_budget()
        self.deadline = time.monotonic() + self.budget

    def delay(self, exc: BaseException) -> float:
        """Seconds to wait before the next attempt; raises once the deadline would pass."""
        delay = min(0.5, 0.02 * 2**self.attempt) * random.uniform(0.5, 1.0)
        self.attempt += 1
        if time.monotonic() + delay > self.deadline:
            logger.warning("Redis Cluster kept rejecting script %s (%s); giving up",
                           self.name, exc)
            raise ClusterUnavailable(
                f"Redis Cluster rejected script {self.name!r} for "
                f"{self.budget:g}s ({exc}); it did not run. A slot migration "
                "or failover is in progress."
            ) from exc
        return delay


@functools.cache
def lua_root() -> Traversable:
    """The folder holding the ``.lua`` files (packaged copy first, then the checkout)."""
    packaged = files(__package__).joinpath("lua")
    if packaged.is_dir():
        return packaged
    return Path(__file__).resolve().parent.parent / "lua"


def script_names() -> list[str]:
    """Names of every shipped script (file names without ``.lua``), sorted."""
    return sorted(p.name[:-4] for p in lua_root().iterdir() if p.name.endswith(".lua"))


class LuaScript:
    """One Lua file, callable on any sync or asyncio client or pipeline."""

    def __init__(self, name: str, source: bytes | None = None) -> None:
        if source is None:
            path = lua_root().joinpath(f"{name}.lua")
            if not path.is_file():
                raise LookupError(f"no Lua script named {name!r} in {lua_root()}")
            source = path.read_bytes()
        self.name = name
        self.source: bytes = source
        self.sha = hashlib.sha1(source).hexdigest()

    def __repr__(self) -> str:
        return f"<LuaScript {self.name} {self.sha[:8]}>"

    def __call__(self, client: Any, keys: Sequence[KeyT] = (), args: Sequence[ArgT] = ()) -> Any:
        """Run the script in one round trip (two only right after the script cache was lost).

        Calls Redis Cluster rejected before running them are re-sent (module docstring).
        """
        # execute_command, not client.evalsha(): two Python calls fewer on every decision.
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            pass
        except Exception as exc:
            if not rejected_before_running(exc):
                raise
            return self._resend(client, keys, args, exc)
        try:
            return client.execute_command("EVAL", self.source, len(keys), *keys, *args)
        except Exception as exc:
            if not rejected_before_running(exc):
                raise
            return self._resend(client, keys, args, exc)

    def _resend(self, client: Any, keys: Sequence[KeyT], args: Sequence[ArgT],
                exc: BaseException) -> Any:
        backoff = _Backoff(self.name)
        while True:
            # Bounded (rejection_budget) jittered back-off after a server rejection:
            # the script did not run; this is not a poll of Redis.
            time.sleep(backoff.delay(exc))
            try:
                return self._once(client, keys, args)
            except Exception as again:
                if not rejected_before_running(again):
                    raise
                exc = again

    def _once(self, client: Any, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        try:
            return client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.execute_command("EVAL", self.source, len(keys), *keys, *args)

    async def acall(
        self, client: Any, keys: Sequence[KeyT] = (), args: Sequence[ArgT] = ()
    ) -> Any:
        """Async twin of :meth:`__call__` for ``redis.asyncio`` clients."""
        try:
            return await self._aonce(client, keys, args)
        except Exception as exc:
            if not rejected_before_running(exc):
                raise
            backoff = _Backoff(self.name)
            while True:
                await asyncio.sleep(backoff.delay(exc))
                try:
                    return await self._aonce(client, keys, args)
                except Exception as again:
                    if not rejected_before_running(again):
                        raise
                    exc = again

    async def _aonce(self, client: Any, keys: Sequence[KeyT], args: Sequence[ArgT]) -> Any:
        try:
            return await client.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.execute_command("EVAL", self.source, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[KeyT] = (), args: Sequence[ArgT] = ()) -> None:
        """Add an ``EVALSHA`` of this script to a pipeline (see :func:`run_many`)."""
        # execute_command, not pipe.evalsha(): redis-py blocks the evalsha *method* on
        # Cluster pipelines, yet routes a queued EVALSHA by its keys' slot correctly.
        pipe.execute_command("EVALSHA", self.sha, len(keys), *keys, *args)


@functools.cache
def script(name: str) -> LuaScript:
    """The process-wide :class:`LuaScript` for ``lua/<name>.lua``."""
    return LuaScript(name)


Call = tuple[LuaScript, Sequence[KeyT], Sequence[ArgT]]


def run_many(client: Any, calls: Sequence[Call]) -> list[Any]:
    """Run several script calls in one round trip (a non-transactional pipeline).

    Returns one result per call, in order; a Redis error in a call is returned in its
    slot (as an exception instance) rather than raised, except ``NOSCRIPT`` and Cluster
    rejections (``TRYAGAIN``...), which are retried for that call alone. On Redis Cluster
    the pipeline is split per node by redis-py; each call's keys must share one slot.
    """
    if len(calls) == 1:
        lua, keys, args = calls[0]
        return [lua(client, keys, args)]
    pipe = client.pipeline(transaction=False)
    for lua, keys, args in calls:
        lua.queue(pipe, keys, args)
    results = pipe.execute(raise_on_error=False)
    for i, result in enumerate(results):
        if isinstance(result, NoScriptError) or (
            isinstance(result, Exception) and rejected_before_running(result)
        ):
            lua, keys, args = calls[i]
            try:
                results[i] = lua(client, keys, args)
            except ClusterUnavailable as exc:
                results[i] = exc
    return list(results)


async def arun_many(client: Any, calls: Sequence[Call]) -> list[Any]:
    """Async twin of :func:`run_many`."""
    if len(calls) == 1:
        lua, keys, args = calls[0]
        return [await lua.acall(client, keys, args)]
    pipe = client.pipeline(transaction=False)
    for lua, keys, args in calls:
        lua.queue(pipe, keys, args)
    results = await pipe.execute(raise_on_error=False)
    for i, result in enumerate(results):
        if isinstance(result, NoScriptError) or (
            isinstance(result, Exception) and rejected_before_running(result)
        ):
            lua, keys, args = calls[i]
            try:
                results[i] = await lua.acall(client, keys, args)
            except ClusterUnavailable as exc:
                results[i] = exc
    return list(results)
