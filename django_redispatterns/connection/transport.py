"""asyncio connections that report a closed transport as a lost connection.

Under uvloop (uvicorn's event loop whenever it is installed), writing to a connection whose
peer has just reset it raises ``RuntimeError: unable to perform operation on <TCPTransport
closed=True ...>; the handler is closed`` where asyncio's own loop raises an ``OSError``.
redis-py passes that ``RuntimeError`` on as it is, so every policy for an unreachable Redis
(fail open, 503, compute without the cache) would miss it and the request would answer
500. It happens when Redis dies just as a connection is being opened or while a command it
has not read is pending (the kernel then resets the connection).

Every asyncio client this package builds uses connection classes from
:func:`reporting_closed_transport`: the same event is then redis-py's ``ConnectionError``
(after redis-py has dropped the connection), exactly what asyncio's loop gives, and each
feature's documented outcome applies.
"""

from __future__ import annotations

from typing import Any

from redis.exceptions import ConnectionError as RedisConnectionError

_CLOSED = "handler is closed"  # uvloop's words for a write on a closed transport
_classes: dict[type, type] = {}


class _ReportsClosedTransport:
    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        try:
            await super().send_packed_command(command, check_health)  # type: ignore[misc]
        except RuntimeError as exc:
            if _CLOSED not in str(exc):
                raise
            # redis-py has disconnected already (it does on any error while writing).
            raise RedisConnectionError(
                f"Error while writing to {_address(self)}: the connection was reset") from exc


def _address(connection: Any) -> str:
    describe = getattr(connection, "_host_error", None)
    if callable(describe):
        return str(describe())
    return f"{getattr(connection, 'host', '?')}:{getattr(connection, 'port', '?')}"


def reporting_closed_transport(connection_class: type) -> type:
    """``connection_class`` (a redis.asyncio connection class), reporting a write on a
    closed transport as ``ConnectionError``. One subclass per class, made once."""
    if issubclass(connection_class, _ReportsClosedTransport):
        return connection_class
    made = _classes.get(connection_class)
    if made is None:
        made = _classes[connection_class] = type(
            connection_class.__name__, (_ReportsClosedTransport, connection_class),
            {"__module__": __name__, "__qualname__": connection_class.__qualname__})
    return made


def report_closed_transports(client: Any) -> Any:
    """Make ``client`` (a redis.asyncio ``Redis`` or ``RedisCluster``, before its first
    command) open its connections with :func:`reporting_closed_transport`; returns it."""
    pool = getattr(client, "connection_pool", None)
    if pool is not None:
        pool.connection_class = reporting_closed_transport(pool.connection_class)
        return client
    # Cluster: the startup nodes, and the keyword arguments it builds other nodes with.
    manager = getattr(client, "nodes_manager", None)
    kwargs = getattr(manager, "connection_kwargs", None)
    if isinstance(kwargs, dict) and "connection_class" in kwargs:
        kwargs["connection_class"] = reporting_closed_transport(kwargs["connection_class"])
    for node in list(getattr(manager, "startup_nodes", {}).values()):
        if hasattr(node, "connection_class"):
            node.connection_class = reporting_closed_transport(node.connection_class)
    return client
