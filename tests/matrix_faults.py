"""The faults of the fault matrix (tests/test_fault_matrix.py), one private server each.

Each fault owns one throwaway ``redis-server`` for the whole module; :func:`injected` puts
it into the fault for one cell and restores it afterwards, so cells share servers without
sharing a fault's after-effects:

========  ====================================================  ==========================
fault     injected                                              restored
========  ====================================================  ==========================
refused   SIGKILL: nothing listens on the port                  started again, empty
hung      SIGSTOP: open sockets, no answer (past the timeout)   SIGCONT
oom       ``CONFIG SET maxmemory 1`` under ``noeviction``       ``maxmemory 0``
readonly  ``REPLICAOF`` a mirror holding a copy of its data     ``REPLICAOF NO ONE``
noscript  ``SCRIPT FLUSH`` (as after a restart or a failover)   nothing to restore
========  ====================================================  ==========================

The app is pointed at the faulted server by :func:`app_on` (``REDIS_PATTERNS`` and the
``default`` / ``patterns`` caches), with a short socket timeout.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from typing import Any

from django.test import override_settings

from django_redispatterns import connection
from tests.redis_servers import CACHE_PREFIX, KEY_PREFIX, RedisServer

FAULTS = ("refused", "hung", "oom", "readonly", "noscript")
SOCKET_TIMEOUT = 0.3
# Every cell answers within this bound (most need one or two socket timeouts; the deploy
# check's probe has a 2 s timeout of its own). Generous for 2 shared, loaded cores.
BOUND = 8.0

MIDDLEWARE_BASE = ["django.middleware.common.CommonMiddleware"]


class Servers:
    """One server per fault, plus the mirror a demoted server replicates from."""

    def __init__(self) -> None:
        self.by_fault: dict[str, RedisServer] = {}
        fast_sync = ("--repl-diskless-sync-delay", "0")
        for fault in FAULTS:
            extra = ("--maxmemory-policy", "noeviction") if fault == "oom" else fast_sync
            self.by_fault[fault] = RedisServer(*extra)
        self.mirror = RedisServer(*fast_sync)

    def stop(self) -> None:
        for server in [*self.by_fault.values(), self.mirror]:
            server.stop()


def _wait_synced(replica: RedisServer, timeout: float = 15.0) -> None:
    client = replica.client()
    deadline = time.monotonic() + timeout
    while True:
        info = client.info("replication")
        if info.get("master_link_status") == "up" and not info.get("master_sync_in_progress"):
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"replica {replica.port} did not sync: {info}")
        time.sleep(0.02)


@contextlib.contextmanager
def _demoted(server: RedisServer, mirror: RedisServer) -> Iterator[None]:
    """``server`` a read-only replica for the block, still holding its data: the mirror
    first copies it, then ``server`` replicates the copy back."""
    mirror_admin, admin = mirror.client(), server.client()
    mirror_admin.execute_command("REPLICAOF", "127.0.0.1", server.port)
    _wait_synced(mirror)
    mirror_admin.execute_command("REPLICAOF", "NO", "ONE")
    admin.execute_command("REPLICAOF", "127.0.0.1", mirror.port)
    try:
        _wait_synced(server)
        yield
    finally:
        admin.execute_command("REPLICAOF", "NO", "ONE")


@contextlib.contextmanager
def injected(fault: str, servers: Servers) -> Iterator[None]:
    """The fault's server in that fault for the block; restored afterwards."""
    server = servers.by_fault[fault]
    admin = server.client()
    if fault == "refused":
        server.kill()
        try:
            yield
        finally:
            server.start()
    elif fault == "hung":
        server.pause()
        try:
            yield
        finally:
            server.resume()
    elif fault == "oom":
        admin.config_set("maxmemory", 1)
        try:
            yield
        finally:
            admin.config_set("maxmemory", 0)
    elif fault == "readonly":
        with _demoted(server, servers.mirror):
            yield
    elif fault == "noscript":
        admin.script_flush()
        yield
    else:
        raise ValueError(fault)


@contextlib.contextmanager
def app_on(server: RedisServer, middleware: list[str] | None = None,
           **patterns: Any) -> Iterator[None]:
    """Every feature and cache alias on ``server``, short timeouts, fresh clients;
    ``patterns`` adds ``REDIS_PATTERNS`` sections."""
    timeouts = {"SOCKET_TIMEOUT": SOCKET_TIMEOUT, "SOCKET_CONNECT_TIMEOUT": SOCKET_TIMEOUT}
    cache = {"LOCATION": server.url, "KEY_PREFIX": CACHE_PREFIX, "TIMEOUT": 300}
    with override_settings(
        ROOT_URLCONF="tests.urls_matrix",
        MIDDLEWARE=middleware or MIDDLEWARE_BASE,
        SESSION_ENGINE="django_redispatterns.sessions",
        CACHES={
            "default": {"BACKEND": "django_redis.cache.RedisCache", **cache,
                        "OPTIONS": timeouts},
            "patterns": {"BACKEND": "django_redispatterns.cache.RedisCache", **cache,
                         "OPTIONS": {**timeouts, "IGNORE_EXCEPTIONS": True,
                                     "STAMPEDE_LEASE": 2}},
            "strict": {"BACKEND": "django_redispatterns.cache.RedisCache", **cache,
                       "OPTIONS": {**timeouts, "STAMPEDE_LEASE": 2}},
        },
        REDIS_PATTERNS={
            "CONNECTION": server.url, "KEY_PREFIX": KEY_PREFIX, **timeouts,
            "IDEMPOTENCY": {"LEASE": 2, "SCOPE": "tests.urls_matrix.scope"},
            **patterns,
        },
        REST_FRAMEWORK={"DEFAULT_THROTTLE_RATES": {"matrix": "1000/m"}},
    ):
        connection.reset_clients()
        try:
            yield
        finally:
            connection.reset_clients()


DOWN = ("refused", "hung")  # nothing answers
WRITES_REFUSED = ("oom", "readonly")  # reads are served, every write is refused


class Raised:
    """What a call raised instead of returning (a cell's outcome may be an exception)."""

    def __init__(self, exc: BaseException) -> None:
        self.exc = exc

    def __repr__(self) -> str:
        return f"Raised({self.exc!r})"


class Cell:
    """One entry point under one fault: ``during(call)`` runs ``call`` in the fault and
    bounds its time; before and after it, the server is healthy."""

    def __init__(self, fault: str, servers: Servers) -> None:
        self.fault = fault
        self.servers = servers
        self.server = servers.by_fault[fault]
        self.took: float | None = None

    @property
    def down(self) -> bool:
        return self.fault in DOWN

    @property
    def writes_refused(self) -> bool:
        return self.fault in WRITES_REFUSED

    @property
    def healthy_answer(self) -> bool:
        """A fault the feature must hide entirely (the script cache was flushed)."""
        return self.fault == "noscript"

    def during(self, call: Any) -> Any:
        """``call()``'s result (or :class:`Raised`) with the fault injected, within BOUND."""
        with injected(self.fault, self.servers):
            started = time.monotonic()
            try:
                result = call()
            except Exception as exc:
                result = Raised(exc)
            self.took = time.monotonic() - started
        assert self.took < BOUND, f"{self.fault}: took {self.took:.1f} s (bound {BOUND} s)"
        return result


ENTRIES: dict[str, tuple[str, Any]] = {}  # entry point -> (feature, run(cell))


def entry(name: str, feature: str) -> Any:
    """Register ``run(cell)`` as the entry point ``name`` of ``feature`` in the matrix."""
    def register(run: Any) -> Any:
        assert name not in ENTRIES, name
        ENTRIES[name] = (feature, run)
        return run
    return register


def raised(outcome: Any, kind: type[BaseException], match: str = "") -> BaseException:
    assert isinstance(outcome, Raised), f"expected {kind.__name__}, got {outcome!r}"
    assert isinstance(outcome.exc, kind), repr(outcome.exc)
    assert match in str(outcome.exc), str(outcome.exc)
    return outcome.exc


def returned(outcome: Any) -> Any:
    assert not isinstance(outcome, Raised), f"raised {outcome.exc!r}"
    return outcome
