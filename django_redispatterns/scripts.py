"""Lua scripts: found in the top-level ``lua/`` folder, loaded once, called by SHA.

Each ``lua/<name>.lua`` becomes one :class:`LuaScript`, created once per process.
Calls go out as ``EVALSHA``; when the server answers ``NOSCRIPT`` (after a restart, a
failover or ``SCRIPT FLUSH``) the same call is sent once as ``EVAL``, which both runs
and caches the script. ``NOSCRIPT`` means the script did not run, so this fallback can
never execute a script twice.

In an installed wheel the scripts live in ``django_redispatterns/lua/`` (force-included
by the build); in a checkout or editable install they are read from ``<repo>/lua/``.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from redis.exceptions import NoScriptError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable  # Python >= 3.11; only for typing

KeyT = str | bytes
ArgT = str | bytes | int | float


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
        """Run the script in one round trip (two only right after the script cache was lost)."""
        try:
            return client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return client.eval(self.source, len(keys), *keys, *args)

    async def acall(
        self, client: Any, keys: Sequence[KeyT] = (), args: Sequence[ArgT] = ()
    ) -> Any:
        """Async twin of :meth:`__call__` for ``redis.asyncio`` clients."""
        try:
            return await client.evalsha(self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await client.eval(self.source, len(keys), *keys, *args)

    def queue(self, pipe: Any, keys: Sequence[KeyT] = (), args: Sequence[ArgT] = ()) -> None:
        """Add an ``EVALSHA`` of this script to a pipeline (see :func:`run_many`)."""
        pipe.evalsha(self.sha, len(keys), *keys, *args)


@functools.cache
def script(name: str) -> LuaScript:
    """The process-wide :class:`LuaScript` for ``lua/<name>.lua``."""
    return LuaScript(name)


Call = tuple[LuaScript, Sequence[KeyT], Sequence[ArgT]]


def run_many(client: Any, calls: Sequence[Call]) -> list[Any]:
    """Run several script calls in one round trip (a non-transactional pipeline).

    Returns one result per call, in order; a Redis error in a call is returned in its
    slot (as an exception instance) rather than raised, except ``NOSCRIPT``, which is
    retried for that call alone.
    """
    if len(calls) == 1:
        lua, keys, args = calls[0]
        return [lua(client, keys, args)]
    pipe = client.pipeline(transaction=False)
    for lua, keys, args in calls:
        lua.queue(pipe, keys, args)
    results = pipe.execute(raise_on_error=False)
    for i, result in enumerate(results):
        if isinstance(result, NoScriptError):
            lua, keys, args = calls[i]
            results[i] = lua(client, keys, args)
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
        if isinstance(result, NoScriptError):
            lua, keys, args = calls[i]
            results[i] = await lua.acall(client, keys, args)
    return list(results)
