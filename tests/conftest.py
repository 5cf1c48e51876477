"""Shared fixtures: a real Redis (never a mock), key cleanup, extra servers on demand.

The main test server may be shared (``REDIS_URL``: another xdist worker, another run or
other software use it too). So every test keeps to its own keys (``KEY_PREFIX``, one per
worker and run), the checks and the clean-up after each test look at those keys only, and
commands that act on a whole server (FLUSHALL, CONFIG SET, SCRIPT FLUSH, CLIENT PAUSE, ...)
are refused on any server this run did not start. A test that needs a whole server
(server-wide statistics, the slow log, the script cache, other databases) asks for
``own_redis``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from django.conf import settings
from django.test import override_settings

from django_redispatterns import connection
from django_redispatterns.connection import redact
from tests.redis_servers import (
    KEY_PREFIX,
    SKIP_REASON,
    RedisServer,
    delete_own_keys,
    harness_redis_url,
    own_keys_without_ttl,
    raw_client,
    reap_orphans,
    redis_server_binary,
    server_version,
    started_here,
)

# Cluster and Sentinel fixtures (redis_cluster, cluster_settings, sentinel_factory, ...);
# the TLS test certificates (tls_certs).
pytest_plugins = ["tests.topology_fixtures", "tests.tls_servers"]

# Commands that act on a whole server (all its keys, settings, statistics, scripts or
# clients): only ever sent to a server this run started. The value names the subcommands
# meant (None: every form of the command).
SERVER_WIDE: dict[str, frozenset[str] | None] = {
    "FLUSHALL": None, "FLUSHDB": None, "SWAPDB": None, "SHUTDOWN": None, "DEBUG": None,
    "REPLICAOF": None, "SLAVEOF": None, "FAILOVER": None,
    "CONFIG": frozenset({"SET", "RESETSTAT", "REWRITE"}),
    "SCRIPT": frozenset({"FLUSH", "KILL"}),
    "FUNCTION": frozenset({"FLUSH", "DELETE", "RESTORE", "KILL"}),
    "CLIENT": frozenset({"PAUSE", "KILL", "UNPAUSE"}),
    "SLOWLOG": frozenset({"RESET"}), "LATENCY": frozenset({"RESET"}),
    "ACL": frozenset({"SETUSER", "DELUSER"}),
}


def _words(args: tuple[Any, ...]) -> list[str]:
    """The command's first two words (redis-py sends some as one: ``"CONFIG SET"``)."""
    words: list[str] = []
    for arg in args[:2]:
        text = arg.decode("utf-8", "replace") if isinstance(arg, bytes) else str(arg)
        words.extend(text.upper().split())  # (a key name may be any bytes)
    return words[:2]


def refuse_server_wide_commands_on_servers_we_did_not_start(
        client: Any, args: tuple[Any, ...]) -> None:
    """Raise before ``args`` reaches a server this run did not start, if it is server-wide."""
    words = _words(args)
    if not words or words[0] not in SERVER_WIDE:
        return
    subcommands = SERVER_WIDE[words[0]]
    if subcommands is not None and (len(words) < 2 or words[1] not in subcommands):
        return
    kwargs = client.connection_pool.connection_kwargs
    if "host" not in kwargs and "path" not in kwargs:
        return  # a Sentinel-managed pool: only the Sentinel topologies this run starts
    if started_here(kwargs.get("host"), kwargs.get("port"), kwargs.get("path")):
        return
    where = kwargs.get("path") or f"{kwargs.get('host')}:{kwargs.get('port')}"
    command = words[0] if subcommands is None else " ".join(words)
    raise AssertionError(
        f"{command} on {where}, a server this test run did not start (a shared REDIS_URL?): "
        "use the own_redis or redis_server_factory fixture for server-wide commands")


@pytest.fixture(scope="session", autouse=True)
def _server_wide_commands_only_on_our_servers() -> Iterator[None]:
    sync_execute = redis.Redis.execute_command
    async_execute = redis.asyncio.Redis.execute_command

    def guarded(self: Any, *args: Any, **options: Any) -> Any:
        refuse_server_wide_commands_on_servers_we_did_not_start(self, args)
        return sync_execute(self, *args, **options)

    async def aguarded(self: Any, *args: Any, **options: Any) -> Any:
        refuse_server_wide_commands_on_servers_we_did_not_start(self, args)
        return await async_execute(self, *args, **options)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(redis.Redis, "execute_command", guarded)
        patch.setattr(redis.asyncio.Redis, "execute_command", aguarded)
        yield


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the real Redis this run uses (as the harness user, when there is one);
    skips the test when there is none."""
    url = harness_redis_url()
    if url is None:
        pytest.skip(SKIP_REASON)
    try:
        raw_client(url, socket_connect_timeout=2).ping()
    except redis.RedisError as exc:
        pytest.skip(f"Redis at {url} is not reachable: {exc}")
    return url


@pytest.fixture
def redis_client(redis_url: str) -> Iterator[redis.Redis]:
    """A raw client on the test Redis; this worker's test keys are removed before and after."""
    client = raw_client(redis_url, socket_timeout=10)
    delete_own_keys(client)
    yield client
    delete_own_keys(client)
    client.close()


def assert_own_keys_have_a_ttl(client: redis.Redis) -> None:
    eternal = own_keys_without_ttl(client)
    assert not eternal, f"keys written without a TTL (every key needs one): {eternal[:10]}"


@pytest.fixture(autouse=True)
def _every_key_has_a_ttl(request: pytest.FixtureRequest) -> Iterator[None]:
    """House rule, checked after every test: no key the app wrote lacks a TTL.

    Scans ``<KEY_PREFIX>:*`` (this worker's REDIS_PATTERNS prefix, tests/settings.py) on the
    main test Redis, then removes this worker's test keys — only those: another worker's
    or program's keys on a shared ``REDIS_URL`` are never checked nor touched. A test that
    writes TTL-less keys on purpose (e.g. the audit's fixtures) says so with
    ``@pytest.mark.allow_no_ttl``.
    """
    yield
    url = harness_redis_url()
    if url is None:
        return
    client = raw_client(url, socket_timeout=10)
    try:
        if request.node.get_closest_marker("allow_no_ttl") is None:
            assert_own_keys_have_a_ttl(client)
        delete_own_keys(client)
    except redis.RedisError:
        pass  # the test broke the main server on purpose; nothing to check
    finally:
        client.close()


@pytest.fixture
def redis_server_factory() -> Iterator[Callable[..., RedisServer]]:
    """Start throwaway redis-server processes (for faults); all are stopped afterwards."""
    servers: list[RedisServer] = []

    def start(*args: str) -> RedisServer:
        try:
            server = RedisServer(*args)
        except RuntimeError as exc:
            pytest.skip(str(exc))
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture
def own_redis(redis_server_factory: Callable[..., RedisServer],
              request: pytest.FixtureRequest) -> Iterator[redis.Redis]:
    """A client on a throwaway server of this test's own, with the app pointed at it.

    For tests that read or change a whole server: server-wide statistics (INFO
    commandstats), the slow log, the script cache, other databases. The test caches at
    ``REDIS_URL`` (hence ``REDIS_PATTERNS["CONNECTION"]``) and ``settings.REDIS_URL`` use it
    for the test; the TTL rule is checked on it afterwards.
    """
    server = redis_server_factory()
    caches = {alias: {**entry, "LOCATION": server.url}
              if entry.get("LOCATION") == settings.REDIS_URL else entry
              for alias, entry in settings.CACHES.items()}
    client = server.client(socket_timeout=10)
    with override_settings(CACHES=caches, REDIS_URL=server.url):
        connection.reset_clients()
        try:
            yield client
        finally:
            connection.reset_clients()
    if request.node.get_closest_marker("allow_no_ttl") is None:
        assert_own_keys_have_a_ttl(client)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # once per run, in the controlling process
        config.stash[ORPHANS] = reap_orphans()


ORPHANS = pytest.StashKey[int]()


def pytest_report_header(config: pytest.Config) -> list[str]:
    binary = redis_server_binary()
    servers = (f"{binary} {'.'.join(map(str, server_version(binary)))}" if binary
               else "none (no binary: Cluster, Sentinel and fault tests skip)")
    if os.environ.get("REDIS_URL"):
        main = (f"{redact(os.environ['REDIS_URL'])} "
                "(REDIS_URL, shared: only this run's keys touched)")
        if os.environ.get("RPTEST_HARNESS_URL"):
            main += f", the tests' own clients as {redact(os.environ['RPTEST_HARNESS_URL'])}"
    else:
        main = "a private server per worker" if binary else f"none ({SKIP_REASON})"
    prefix = KEY_PREFIX.rsplit("-", 1)[0]
    orphans = config.stash.get(ORPHANS, 0)
    return [f"redis: main {main}; servers started: {servers}"
            + (f"; stopped {orphans} left behind by an earlier killed run" if orphans else ""),
            f"redis: test keys under {prefix}-<worker>:* and {prefix}-<worker>-*"]
