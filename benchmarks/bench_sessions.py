"""Sessions: ours vs Django's cache engine on django-redis vs django-redis-sessions (one Redis).

Scenarios, each one simulated request of a signed-in user on an existing session:
1. load + modify + save (``SESSION_SAVE_EVERY_REQUEST`` or any view that writes the session):
   ours is HGET + one Lua call that also keeps the per-user index; Django's cache engine is
   GET, then GET (exists check) + SET; django-redis-sessions is GET + unconditional SETEX;
2. load only (a request that reads the session and saves nothing);
3. load only with ours' ``SESSIONS["NEAR_CACHE"]`` on: served from process memory.

A fourth contender is the floor any Redis session engine with a per-user index pays: a GET of
unsigned JSON, then one pipeline (SET with expiry, ZADD to the index, PEXPIRE the index); no
signature, no atomicity (it would resurrect a session deleted meanwhile), no metadata.

Each runs twice: on loopback (CPU-bound: Lua and signature checks show), and through a
small latency proxy standing in for a network link (round trips show).
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import redis
from django.conf import settings
from django.contrib.auth import BACKEND_SESSION_KEY, HASH_SESSION_KEY, SESSION_KEY
from django.contrib.sessions.backends.base import SessionBase
from django.contrib.sessions.backends.cache import SessionStore as CacheStore
from django.test import override_settings

from benchmarks.harness import compare
from django_redispatterns.sessions import SessionStore as OurStore


def _user_session(store_cls: type[SessionBase]) -> str:
    store = store_cls()
    store.update({SESSION_KEY: "42", HASH_SESSION_KEY: "f" * 64, "cart": [1, 2, 3], "n": 0,
                  BACKEND_SESSION_KEY: "django.contrib.auth.backends.ModelBackend"})
    store.save()
    assert store.session_key is not None
    return store.session_key


def _write_cycle(store_cls: type[SessionBase], key: str) -> Callable[[], None]:
    def request() -> None:
        store = store_cls(key)
        store["n"] = store.get("n", 0) + 1  # loads
        store.save()
        assert store.session_key == key
    return request


def _read_cycle(store_cls: type[SessionBase], key: str) -> Callable[[], None]:
    def request() -> None:
        assert store_cls(key).get(SESSION_KEY) == "42"
    return request


FLOOR_TTL_MS = 1_209_600_000


def _floor(url: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(load + modify + save, load only) of the floor: GET, then one pipeline."""
    client: Any = redis.Redis.from_url(url)
    data_key, index_key = "rptest-floor:{u42}:s:abc", "rptest-floor:{u42}:u"
    client.set(data_key, json.dumps({SESSION_KEY: "42", HASH_SESSION_KEY: "f" * 64, "n": 0,
                                     "cart": [1, 2, 3], BACKEND_SESSION_KEY: "x" * 41}),
               px=FLOOR_TTL_MS)

    def write() -> None:
        session = json.loads(client.get(data_key))
        session["n"] += 1
        pipe = client.pipeline(transaction=False)
        pipe.set(data_key, json.dumps(session, separators=(",", ":")), px=FLOOR_TTL_MS)
        pipe.zadd(index_key, {"abc": int(time.time() * 1000) + FLOOR_TTL_MS})
        pipe.pexpire(index_key, FLOOR_TTL_MS + 60_000)
        pipe.execute()

    def read() -> None:
        assert json.loads(client.get(data_key))[SESSION_KEY] == "42"

    return write, read


def _drs_store(url: str) -> type[SessionBase] | None:
    try:
        import redis_sessions.settings as drs_settings
        from redis_sessions.session import SessionStore as DrsStore
    except ImportError:
        print("django-redis-sessions not installed: pip install django-redis-sessions")
        return None
    from redis_sessions.session import RedisServer

    drs_settings.SESSION_REDIS_CONNECTION_OBJECT = redis.Redis.from_url(url)
    drs_settings.SESSION_REDIS_PREFIX = "rptest-drs"
    RedisServer._RedisServer__redis.clear()  # its class-level client cache
    return DrsStore


def run() -> None:
    url = settings.REDIS_URL
    _run_on(url, "loopback", ops=1000, rounds=11)
    with LatencyProxy(url, one_way_ms=0.1) as proxy:
        _run_on(proxy.url, f"through a {proxy.rtt_ms:.2f} ms round-trip link", ops=200, rounds=5)
    _cleanup(url)


def _run_on(url: str, network: str, *, ops: int, rounds: int) -> None:
    """Every scenario with all contenders on the Redis at ``url``."""
    caches = {**settings.CACHES, "bench": {**settings.CACHES["default"], "LOCATION": url}}
    config = {**settings.REDIS_PATTERNS, "SESSIONS": {"CONNECTION": url}}
    with override_settings(CACHES=caches, SESSION_CACHE_ALIAS="bench", REDIS_PATTERNS=config):
        contenders: dict[str, tuple[type[SessionBase], str]] = {
            "ours (Lua save + per-user index)": (OurStore, _user_session(OurStore)),
            "Django cache engine + django-redis": (CacheStore, _user_session(CacheStore)),
        }
        drs = _drs_store(url)
        if drs is not None:
            contenders["django-redis-sessions 0.6.2"] = (drs, _user_session(drs))
        scenarios: list[tuple[str, Callable[[type[SessionBase], str], Callable[[], None]]]] = [
            ("session load + modify + save (signed-in user)", _write_cycle),
            ("session load only (signed-in user)", _read_cycle),
        ]
        floor = _floor(url)
        for n, (title, make) in enumerate(scenarios):
            requests: dict[str, Callable[[], object]] = {
                name: make(cls, key) for name, (cls, key) in contenders.items()}
            requests["floor: GET + one pipeline with an index"] = floor[n]
            compare(f"{title}, {network}", requests, ops=ops, rounds=rounds, warmup=ops // 5)
            print("round trips per request: " + ", ".join(
                f"{name.split(' (')[0]} {_round_trips(fn)}" for name, fn in requests.items()))
            print("client CPU per request (best of 5, us): " + ", ".join(
                f"{name.split(' (')[0]} {_cpu_us(fn, ops // 2):.0f}"
                for name, fn in requests.items()))
        _memory_load(url, config, contenders, network, ops=ops, rounds=rounds)
        for cls, key in contenders.values():
            cls(key).delete()


def _memory_load(url: str, config: dict[str, Any],
                 contenders: dict[str, tuple[type[SessionBase], str]], network: str, *,
                 ops: int, rounds: int) -> None:
    """Load only, ours with SESSIONS["NEAR_CACHE"] on (served from process memory)."""
    from django_redispatterns.sessions import memory

    ours_key = next(key for cls, key in contenders.values() if cls is OurStore)
    theirs_key = next(key for cls, key in contenders.values() if cls is CacheStore)
    on = {**config, "SESSIONS": {"CONNECTION": url, "NEAR_CACHE": True}}
    with override_settings(REDIS_PATTERNS=on):
        try:
            requests: dict[str, Callable[[], object]] = {
                "ours, NEAR_CACHE on (process memory)": _read_cycle(OurStore, ours_key),
                "Django cache engine + django-redis": _read_cycle(CacheStore, theirs_key),
            }
            compare(f"session load only (signed-in user), NEAR_CACHE on, {network}", requests,
                    ops=ops, rounds=rounds, warmup=ops // 5)
        finally:
            memory.stop()


class LatencyProxy:
    """A TCP proxy on loopback that delays every chunk by ``one_way_ms`` each way.

    Stands in for a network between app and Redis, where round trips, not CPU, dominate.
    """

    def __init__(self, url: str, *, one_way_ms: float) -> None:
        target = urlsplit(url)
        self.target = (target.hostname or "127.0.0.1", target.port or 6379)
        self.delay = one_way_ms / 1000
        self.server = socket.create_server(("127.0.0.1", 0))
        self.port = self.server.getsockname()[1]
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()
        client = redis.Redis.from_url(self.url)
        started = time.perf_counter()
        for _ in range(50):
            client.ping()
        self.rtt_ms = (time.perf_counter() - started) / 50 * 1000
        client.close()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                downstream, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target)
            for src, dst in ((downstream, upstream), (upstream, downstream)):
                src.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                threading.Thread(target=self._pump, args=(src, dst), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                time.sleep(self.delay)
                dst.sendall(data)
        with contextlib.suppress(OSError):
            dst.close()

    def __enter__(self) -> LatencyProxy:
        return self

    def __exit__(self, *exc: object) -> None:
        self.closed.set()
        self.server.close()


def _cpu_us(fn: Callable[[], object], ops: int) -> float:
    """Process CPU time per call (microseconds; best of 5 runs): the app server's cost,
    steadier than throughput on a shared machine, blind to Redis's own time."""
    best = float("inf")
    for _ in range(5):
        started = time.process_time()
        for _ in range(ops):
            fn()
        best = min(best, time.process_time() - started)
    return best / ops * 1e6


def _round_trips(fn: Callable[[], object]) -> int:
    """Connections taken from any redis-py pool while ``fn`` runs (= round trips)."""
    original = redis.ConnectionPool.get_connection
    calls = 0

    def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return original(self, *args, **kwargs)

    redis.ConnectionPool.get_connection = counting  # type: ignore[method-assign]
    try:
        fn()
    finally:
        redis.ConnectionPool.get_connection = original  # type: ignore[method-assign]
    return calls


def _cleanup(url: str) -> None:
    client: Any = redis.Redis.from_url(url)
    for pattern in ("rptest-drs*", "rptest-floor*"):
        for key in client.scan_iter(match=pattern):
            client.delete(key)
