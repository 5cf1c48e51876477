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

:func:`unknown_redirect` covers a redis-py gap on every command: an ``ASK`` that names a
master the client's slot map does not list yet (one that joined the cluster after the
client started) ends in an ``AttributeError`` before the command is sent anywhere.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import AskError, ClusterError, MovedError, RedisError, TryAgainError

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
                except (RedisError, AttributeError) as exc:
                    command.result = unknown_redirect(pipe, exc) or exc
        results = [c.result for c in sorted(stack, key=lambda c: c.position)]
    finally:
        pipe.reset()
    if raise_on_error:
        for result in results:
            if isinstance(result, Exception):
                raise result
    return results


def unknown_redirect(client: Any, exc: BaseException) -> ClusterError | None:
    """For redis-py's ``AttributeError`` on an ``ASK`` to a node missing from the slot
    map: add the cluster's masters to the client's node cache and return a
    ``ClusterError`` saying the command did not run (features treat it as Redis being
    unavailable; scripts re-send it within their budget). None for any other exception."""
    if not _is_unknown_redirect(exc):
        return None
    manager = client.nodes_manager
    manager.initialize()
    for known in _primaries(manager):
        try:
            raw = client.get_redis_connection(known).execute_command("CLUSTER NODES")
        except RedisError:
            continue
        _add_masters(manager, raw, lambda host, port: _sync_node(host, port))
        break
    return _not_run(exc)


async def aunknown_redirect(client: Any, exc: BaseException) -> ClusterError | None:
    """Async twin of :func:`unknown_redirect` for ``redis.asyncio`` Cluster clients."""
    if not _is_unknown_redirect(exc):
        return None
    from redis.asyncio.cluster import ClusterNode as AsyncNode

    manager = client.nodes_manager
    await manager.initialize()
    kwargs = manager.connection_kwargs
    for known in _primaries(manager):
        try:
            raw = await known.execute_command("CLUSTER NODES")
        except RedisError:
            continue
        _add_masters(manager, raw,
                     lambda host, port: AsyncNode(host, port, server_type=_PRIMARY, **kwargs))
        break
    return _not_run(exc)


_PRIMARY = "primary"  # redis-py's server_type of a master
# The words redis-py's AttributeError uses when an ASK names an unknown node (sync, async;
# redis-py 8.2+ raises another one, about the missing node's ``host``, while recording it).
_UNKNOWN_NODE = ("'redis_connection'", "'execute_command'", "'connection_kwargs'", "'host'")


def _is_unknown_redirect(exc: BaseException) -> bool:
    return isinstance(exc, AttributeError) and "'NoneType'" in str(exc) and any(
        word in str(exc) for word in _UNKNOWN_NODE)


def _not_run(exc: BaseException) -> ClusterError:
    return ClusterError(f"redirected to a Redis Cluster node not yet in the slot map; "
                        f"the command did not run ({exc})")


def _primaries(manager: Any) -> list[Any]:
    return [n for n in list(manager.nodes_cache.values()) if n.server_type == _PRIMARY]


def _sync_node(host: str, port: int) -> Any:
    from redis.cluster import ClusterNode

    return ClusterNode(host, port, server_type=_PRIMARY)


def _add_masters(manager: Any, raw: Any, make: Any) -> None:
    """Add the masters ``CLUSTER NODES`` lists (``raw``: text, or redis-py's parsed dict)
    to the node cache. ``CLUSTER SLOTS``, which redis-py reads, omits a master that owns
    no slot yet: one importing its first slot, exactly the one an ``ASK`` names."""
    text = raw.decode() if isinstance(raw, bytes) else raw
    lines = text.split("\n") if isinstance(text, str) else [
        f"- {name} {info.get('flags', '')}" for name, info in dict(text).items()]
    for line in lines:
        parts = line.split()
        if len(parts) < 3 or "master" not in parts[2] or "fail" in parts[2]:
            continue
        host, _, port = parts[1].split("@")[0].split(",")[0].rpartition(":")
        if host and port.isdigit() and f"{host}:{port}" not in manager.nodes_cache:
            node = make(host, int(port))
            manager.nodes_cache[node.name] = node
