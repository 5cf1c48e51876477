"""Cluster pipelines that never send a command twice.

redis-py's synchronous ``ClusterPipeline`` re-sends, one at a time, every queued command
of a node whose connection timed out or broke while the pipeline ran, and it marks every
command of that node as failed first, including the ones that had already answered. Each
of those commands may have run: a rate-limit hit would count twice, a lock be taken twice.
The pipelines our Cluster clients hand out keep redis-py's routing and still follow the
answers that prove a command did *not* run (``MOVED``, ``ASK``, ``TRYAGAIN``), one command
at a time through the client, but report a timeout or connection error in the command's
result slot (or raise it) instead of re-sending. Transactions (``MULTI``/``EXEC``) are
left to redis-py.

The asyncio ``ClusterPipeline`` re-sends only the redirected commands already.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import AskError, MovedError, RedisError, TryAgainError

#: Answers that mean the command did not run on the node that sent them.
NOT_RUN = (MovedError, AskError, TryAgainError)


def pipeline_without_resend(pipe: Any) -> Any:
    """``pipe`` (a non-transactional sync ``ClusterPipeline``) with an ``execute`` that never
    re-sends a command after a timeout or connection error; returns ``pipe``.

    Left as it is when this redis-py's pipeline does not expose what that needs."""
    if _queued(pipe) is None or not hasattr(pipe, "send_cluster_commands"):
        return pipe

    def execute(raise_on_error: bool = True) -> list[Any]:
        return _execute(pipe, raise_on_error)

    pipe.execute = execute
    return pipe


def _queued(pipe: Any) -> list[Any] | None:
    strategy = getattr(pipe, "_execution_strategy", None)  # redis-py >= 6
    queue = getattr(strategy, "command_queue", None) if strategy is not None else getattr(
        pipe, "command_stack", None)
    return list(queue) if isinstance(queue, list) else None


def _execute(pipe: Any, raise_on_error: bool) -> list[Any]:
    stack = _queued(pipe) or []
    try:
        if not stack:
            return []
        pipe.send_cluster_commands(stack, raise_on_error=False, allow_redirections=False)
        for command in stack:
            if isinstance(command.result, NOT_RUN):
                try:  # follows the redirect, and bounded TRYAGAIN, for this command alone
                    command.result = pipe.parent_execute_command(*command.args,
                                                                 **command.options)
                except RedisError as exc:
                    command.result = exc
        results = [c.result for c in sorted(stack, key=lambda c: c.position)]
    finally:
        pipe.reset()
    if raise_on_error:
        for result in results:
            if isinstance(result, Exception):
                raise result
    return results
