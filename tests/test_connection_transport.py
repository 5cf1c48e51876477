"""Under uvloop, a connection Redis reset is a ConnectionError, as under asyncio's own loop.

uvloop raises ``RuntimeError: ... the handler is closed`` for a write on a transport the
peer has reset, and redis-py passes it on: the soak under uvicorn answered 500 on the
cache, idempotency and session routes when Redis was killed just as a connection opened.
Here the reset is made deterministic with a real server: a command is left unread in a
stopped server's socket, then the server is killed (the kernel resets a connection with
unread data), and the loop notices before the next write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from django_redispatterns.connection.build import from_url
from tests.redis_servers import KEY_PREFIX, RedisServer
from tests.test_cache_faults import fault_cache

uvloop = pytest.importorskip("uvloop")
KEY = f"{KEY_PREFIX}:transport"


@pytest.fixture
def server(redis_server_factory: Callable[..., RedisServer]) -> Iterator[RedisServer]:
    yield redis_server_factory()


def run_on_uvloop(test: Callable[[], Awaitable[Any]]) -> Any:
    return uvloop.run(test())


async def reset_a_pooled_connection(client: Any, server: RedisServer) -> None:
    """Leave ``client``'s pooled connection open on our side and reset on the server's:
    the server dies (SIGKILL) while a command it never read waits in its socket."""
    await client.ping()
    pool = client.connection_pool
    # redis-py < 5.3 needs a command name (5.3+ deprecates it)
    connection = await (pool.get_connection("PING") if redis.VERSION < (5, 3)
                        else pool.get_connection())
    server.pause()
    await connection.send_command("PING")  # unread: the server is stopped
    server.kill()
    await asyncio.sleep(0.3)  # the loop reads the reset and closes the transport
    await pool.release(connection)


def test_a_bare_redis_py_connection_on_uvloop_raises_runtime_error(server: RedisServer):
    """The defect this module guards against, shown on redis-py alone: before 8.2 it passes
    uvloop's ``RuntimeError`` on; redis-py 8.2 reports a ``ConnectionError`` itself, and the
    guard stays for the older releases the package supports. (If either changes again,
    this test says so.)"""

    async def scenario() -> BaseException:
        client = redis.asyncio.Redis.from_url(server.url, socket_timeout=2)
        await reset_a_pooled_connection(client, server)
        try:
            await client.get("x")
        except BaseException as exc:  # the type is what is checked
            return exc
        finally:
            await client.aclose()
        raise AssertionError("the reset connection did not fail")

    error = run_on_uvloop(scenario)
    if tuple(int(part) for part in redis.__version__.split(".")[:2]) >= (8, 2):
        assert isinstance(error, redis.ConnectionError), repr(error)
    else:
        assert isinstance(error, RuntimeError) and "handler is closed" in str(error)


@pytest.mark.parametrize("build", ["url client", "cache client"])
def test_a_reset_connection_is_a_connection_error_and_the_retry_reconnects(
        server: RedisServer, build: str):
    """Our asyncio clients (from a URL, and the cache's own) see a ConnectionError, so
    their one retry after a connection error reconnects to the restarted server."""

    async def scenario() -> bytes | None:
        if build == "url client":
            client = from_url(server.url, asyncio_client=True)
        else:
            client = fault_cache(server.url)._aclients.get()
        await client.set(KEY, b"v", px=60_000)
        await reset_a_pooled_connection(client, server)
        server.start()
        try:
            return await client.get(KEY)  # type: ignore[no-any-return]
        finally:
            await client.aclose()

    # Without persistence the restarted server is empty: the answer is None, not an error.
    assert run_on_uvloop(scenario) is None


def test_aget_or_set_with_ignore_exceptions_computes_when_redis_died_under_uvloop(
        server: RedisServer):
    """The soak's 500: with IGNORE_EXCEPTIONS, a cache miss while Redis is gone computes
    the value (the documented outcome), whichever event loop runs it."""
    cache = fault_cache(server.url)
    computed: list[str] = []

    async def compute() -> str:
        computed.append("ran")
        return "fresh"

    async def scenario() -> Any:
        client = cache._aclients.get()
        await reset_a_pooled_connection(client, server)
        try:
            return await cache.aget_or_set(KEY, compute, timeout=30)
        finally:
            await client.aclose()

    assert run_on_uvloop(scenario) == "fresh"
    assert computed == ["ran"]


@pytest.mark.parametrize("url", [
    "redis://127.0.0.1:1/0", "rediss://127.0.0.1:1/0", "unix:///tmp/rptest-none.sock",
    "redis+sentinel://127.0.0.1:1/mymaster/0", "redis+cluster://127.0.0.1:1,127.0.0.1:2",
])
def test_every_asyncio_client_built_from_a_url_opens_guarded_connections(url: str):
    from django_redispatterns.connection.transport import reporting_closed_transport

    client = from_url(url, asyncio_client=True)
    manager = getattr(client, "nodes_manager", None)
    if manager is None:
        classes = [client.connection_pool.connection_class]
    else:
        classes = [manager.connection_kwargs["connection_class"],
                   *(node.connection_class for node in manager.startup_nodes.values())]
    assert all(reporting_closed_transport(cls) is cls for cls in classes), classes
