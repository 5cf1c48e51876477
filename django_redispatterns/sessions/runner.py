"""Running a session operation written once as a generator of Redis steps, sync or asyncio.

Each Redis-touching method of the engine is a generator that yields Redis operations and
receives their results; :func:`run` executes them on the sync client and :func:`arun` on the
asyncio one, so both APIs share every decision. An operation is a client method with a key
and one more argument, such as ``("hexists", key, field)``, or ``("script", name, keys,
args)`` or ``("many", [(name, keys, args), ...])`` (one pipeline), or ``("call", function,
*args)``: blocking work of another store (the previous session engine), run in a thread
under asyncio. ``load()`` and ``save()``,
one command each, call the client directly instead.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

import redis
from asgiref.sync import sync_to_async

from .. import scripts
from .keyspace import UNAVAILABLE, aclient, client

Op = tuple[Any, ...]
Steps = Generator[Op, Any, Any]
# Turns an unreachable-Redis error into the exception to raise (BackendUnavailable).
OnUnavailable = Callable[[BaseException], BaseException]


def _execute(redis_client: Any, op: Op) -> Any:
    kind = op[0]
    if kind == "call":
        return op[1](*op[2:])
    if kind == "script":
        return scripts.script(op[1])(redis_client, op[2], op[3])
    if kind == "many":
        return scripts.run_many(redis_client, [(scripts.script(n), k, a) for n, k, a in op[1]])
    return getattr(redis_client, kind)(op[1], op[2])


async def _aexecute(redis_client: Any, op: Op) -> Any:
    kind = op[0]
    if kind == "call":
        return await sync_to_async(op[1])(*op[2:])
    if kind == "script":
        return await scripts.script(op[1]).acall(redis_client, op[2], op[3])
    if kind == "many":
        return await scripts.arun_many(
            redis_client, [(scripts.script(n), k, a) for n, k, a in op[1]])
    return await getattr(redis_client, kind)(op[1], op[2])


def run(steps: Steps, on_unavailable: OnUnavailable) -> Any:
    """Run ``steps`` on the sync client; return the generator's return value."""
    redis_client, (more, value) = client(), step(steps, on_unavailable)
    while more:
        try:
            more, value = step(steps, on_unavailable, _execute(redis_client, value))
        except redis.exceptions.RedisError as exc:
            more, value = step(steps, on_unavailable, error=exc)
    return value


async def arun(steps: Steps, on_unavailable: OnUnavailable) -> Any:
    """Run ``steps`` on the asyncio client; return the generator's return value."""
    redis_client, (more, value) = aclient(), step(steps, on_unavailable)
    while more:
        try:
            more, value = step(steps, on_unavailable, await _aexecute(redis_client, value))
        except redis.exceptions.RedisError as exc:
            more, value = step(steps, on_unavailable, error=exc)
    return value


def step(steps: Steps, on_unavailable: OnUnavailable, result: Any = None,
         error: BaseException | None = None) -> tuple[bool, Any]:
    """Feed one outcome to ``steps``: (True, next operation) or (False, its value).

    An unreachable Redis becomes ``on_unavailable(error)`` (raised); a ``ResponseError`` is
    thrown into the steps, which may handle it. A Redis error raised by a failed call inside
    a pipeline comes through here too, so READONLY in a pipeline slot counts as unreachable.
    """
    if isinstance(error, UNAVAILABLE):
        raise on_unavailable(error) from error
    if error is not None and not isinstance(error, redis.exceptions.ResponseError):
        raise error
    try:
        return True, (steps.throw(error) if error is not None else steps.send(result))
    except StopIteration as done:
        return False, done.value
