"""``django_redispatterns.cache.RedisCache``: django-redis's backend, extended.

Everything django-redis does keeps working (the same client classes, serializers,
compressors, replicas, ``IGNORE_EXCEPTIONS``, ``ttl``/``expire``/``lock``/``delete_pattern``);
on top of it this backend guarantees:

* every write has a TTL (``timeout=None`` raises :class:`MissingTTLError` unless
  ``OPTIONS["ALLOW_NO_TTL"]``), optionally jittered downwards (``OPTIONS["TTL_JITTER"]``);
* ``get_or_set``/``aget_or_set`` compute a missing value once across threads and
  processes, refresh hot values early (XFetch) and serve stale values while one caller
  recomputes (``OPTIONS["STALE_TTL"]``) — see :mod:`.stampede`;
* ``incr``/``decr``/``aincr``/``adecr`` are one atomic command that keeps the TTL;
* ``clear()`` deletes only this cache's ``KEY_PREFIX`` (SCAN + UNLINK in batches);
* ``aget``/``aset``/``aadd``/``adelete``/``aget_many``/``ahas_key``/``atouch``/``aincr``/
  ``aget_or_set`` run on ``redis.asyncio`` (no thread hop) for single-URL locations.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import random
import socket
import threading
import time
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar

import redis
import redis.asyncio
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django_redis.cache import RedisCache as DjangoRedisCache
from django_redis.client import DefaultClient, HerdClient, SentinelClient, ShardClient
from django_redis.client.default import glob_escape
from redis.backoff import NoBackoff
from redis.crc import key_slot
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import ResponseError, WatchError
from redis.exceptions import TimeoutError as RedisTimeoutError

from ..exceptions import ConfigurationError, MissingTTLError
from ..scripts import script
from . import envelope, stampede

logger = logging.getLogger("django_redispatterns.cache")

# "Redis cannot serve this now": also a demoted primary (READONLY), a full one (OOM) and
# Redis Cluster's CLUSTERDOWN / TRYAGAIN / "TTL exhausted" (django-redis's
# IGNORE_EXCEPTIONS treats every ResponseError this way).
_REDIS_ERRORS = (RedisConnectionError, RedisTimeoutError, redis.exceptions.ReadOnlyError,
                 redis.exceptions.OutOfMemoryError, redis.exceptions.ClusterError,
                 redis.exceptions.TryAgainError, redis.exceptions.SlotNotCoveredError,
                 socket.timeout, OSError)
_MISSING = object()
_MAGIC_LEN = len(envelope.MAGIC)
_FAILED = object()


class _Flight:
    """One in-process get_or_set attempt that other threads missing the key wait for."""

    __slots__ = ("done", "ok", "value")

    def __init__(self) -> None:
        self.done = threading.Event()
        self.ok = False
        self.value: Any = None


_flights: dict[tuple[str, str], _Flight] = {}
_flights_lock = threading.Lock()
_async_flights: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, str], asyncio.Future[Any]]
] = weakref.WeakKeyDictionary()
_CLEAR_BATCH = 500
ASYNC_MAX_CONNECTIONS = 500
ASYNC_POOL_WAIT = 10.0  # seconds a coroutine waits for a free pooled connection
T = TypeVar("T")

# One asyncio client per (event loop, location): backends are per thread / per task in
# Django, connection pools must not be.
_async_clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[tuple[Any, ...], Any]] = (
    weakref.WeakKeyDictionary()
)


class _EnvelopeAwareDecode:
    """Mixed into the configured client class: every django-redis read path (``get``,
    ``incr_version``, ``get_many`` of other client classes...) unwraps an envelope."""

    def decode(self, value: Any) -> Any:
        if isinstance(value, bytes) and envelope.is_envelope(value):
            value = envelope.split(value)[3]
        return super().decode(value)  # type: ignore[misc]


if "allow_int" in inspect.signature(DefaultClient.encode).parameters:  # django-redis >= 7

    def _serialize(client: Any, value: Any) -> bytes:
        return client.encode(value, allow_int=False)

else:  # django-redis 5.4 / 6: encode() passes ints through; this is its non-int branch

    def _serialize(client: Any, value: Any) -> bytes:
        return client._compressor.compress(client._serializer.dumps(value))


@functools.cache
def _client_class(base: type) -> type:
    return type(base.__name__, (_EnvelopeAwareDecode, base), {"__module__": base.__module__})


def _option(options: dict[str, Any], name: str, default: Any, kind: tuple[type, ...],
            *, minimum: Any = None, maximum: Any = None) -> Any:
    value = options.get(name, default)
    if value is None and default is None:
        return None
    if (isinstance(value, bool) and bool not in kind) or not isinstance(value, kind):
        raise ConfigurationError(
            f"CACHES OPTIONS[{name!r}] must be {' or '.join(k.__name__ for k in kind)}, "
            f"got {value!r}."
        )
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ConfigurationError(
            f"CACHES OPTIONS[{name!r}] must be between {minimum} and {maximum}, got {value!r}."
        )
    return value


class RedisCache(DjangoRedisCache):
    """django-redis's ``RedisCache`` with TTL discipline and stampede protection.

    OPTIONS (besides every django-redis option): ``ALLOW_NO_TTL`` (False), ``TTL_JITTER``
    (0.0, a fraction), ``STALE_TTL`` (0 s), ``XFETCH_BETA`` (1.0; 0 turns it off),
    ``STAMPEDE_LEASE`` (10 s), ``STAMPEDE_WAIT`` (2 x lease), ``CLEAR_FLUSHDB`` (False).
    """

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        super().__init__(server, params)
        options: dict[str, Any] = params.get("OPTIONS", {})
        number = (int, float)
        self._allow_no_ttl: bool = _option(options, "ALLOW_NO_TTL", False, (bool,))
        self._jitter: float = _option(options, "TTL_JITTER", 0.0, number, minimum=0, maximum=0.9)
        self._clear_flushdb: bool = _option(options, "CLEAR_FLUSHDB", False, (bool,))
        lease = _option(options, "STAMPEDE_LEASE", 10, number, minimum=0.01)
        self._policy = stampede.Policy(
            lease=float(lease),
            max_wait=float(_option(options, "STAMPEDE_WAIT", 2 * lease, number, minimum=0)),
            stale_ttl=float(_option(options, "STALE_TTL", 0, number, minimum=0)),
            beta=float(_option(options, "XFETCH_BETA", 1.0, number, minimum=0)),
            block_cap=stampede.block_cap(options.get("SOCKET_TIMEOUT")),
        )
        self._options = options
        # django-redis builds its client from this class (lazily, in its ``client``
        # property, which tests may patch): the same class plus envelope-aware decode.
        base: type = self._client_cls  # type: ignore[has-type]
        self._herd = issubclass(base, HerdClient)
        self._shard = issubclass(base, ShardClient)
        # The hit path calls django-redis's own decode, skipping the envelope-aware wrapper.
        self._plain_decode = base.decode  # type: ignore[attr-defined]
        self._client_cls = _client_class(base)

    # --- client ---------------------------------------------------------------------

    def _single_flight(self) -> bool:
        # HerdClient stores its own packed tuples; it is superseded by this backend, so
        # with it get_or_set keeps Django's behaviour instead of mixing the two formats.
        return not self._herd

    def _primary(self, nkey: str) -> Any:
        if self._shard:
            return self.client.get_server(nkey)
        return self.client.get_client(write=True)

    def _reader(self, nkey: str) -> Any:
        if self._shard:
            return self.client.get_server(nkey)
        return self.client.get_client(write=False)

    def _lock_elsewhere(self, nkey: str) -> bool:
        """True on Redis Cluster for a key whose lock cannot share its slot."""
        if self._companion_key(nkey, "lock").startswith(f"{self.key_prefix}:{{"):
            return False
        from ..connection import is_cluster

        return is_cluster(self._primary(nkey))

    def _companion_key(self, nkey: str, kind: str) -> str:
        """A key of ours next to cache key ``nkey``: same hash slot (a script touches
        both on Redis Cluster), inside this cache's KEY_PREFIX, and outside the
        ``prefix:version:*`` space that ``keys()``, ``delete_pattern()`` and ``clear()``
        walk. The hash tag is ``nkey``'s own tag, or ``nkey`` itself when it has none."""
        nkey = str(nkey)
        open_at = nkey.find("{")
        close_at = nkey.find("}", open_at + 1) if open_at >= 0 else -1
        if open_at >= 0 and close_at > open_at + 1:
            candidate = f"{self.key_prefix}:{{{nkey[open_at + 1:close_at]}}}:rp-{kind}:{nkey}"
        else:
            candidate = f"{self.key_prefix}:{{{nkey}}}:rp-{kind}"
        if key_slot(candidate.encode()) == key_slot(nkey.encode()):
            return candidate
        # A key with a lone '}' and no tag cannot be co-located; fine on one node.
        return f"{self.key_prefix}:rp-{kind}:{nkey}"

    # --- TTL discipline ---------------------------------------------------------------

    def _resolve_ttl(self, timeout: Any) -> float | None:
        """The timeout a write uses: the default resolved, ``None`` refused (D1), jittered."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout
        if timeout is None:
            if not self._allow_no_ttl:
                raise MissingTTLError(
                    "cache writes need a timeout: timeout=None would keep the key forever "
                    "(set OPTIONS['ALLOW_NO_TTL'] = True to allow it)"
                )
            return None
        if self._jitter and timeout > 0:
            # Downwards only: a value never lives longer than the caller asked.
            timeout = timeout * (1.0 - random.random() * self._jitter)
        return timeout

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
            client: Any = None, nx: bool = False, xx: bool = False) -> Any:
        return super().set(key, value, self._resolve_ttl(timeout), version=version,
                           client=client, nx=nx, xx=xx)

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
            client: Any = None) -> Any:
        return super().add(key, value, self._resolve_ttl(timeout), version=version, client=client)

    def set_many(self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None, client: Any = None) -> Any:
        ttl = self._resolve_ttl(timeout)
        if not self._jitter or self._shard:
            return super().set_many(data, ttl, version=version, client=client)
        return self._set_many_jittered(data, timeout, version)

    def _set_many_jittered(self, data: dict[Any, Any], timeout: Any, version: int | None) -> Any:
        # Each key its own jitter, still one round trip.
        pipe = self.client.get_client(write=True).pipeline()
        for key, value in data.items():
            self.client.set(key, value, self._resolve_ttl(timeout), version=version, client=pipe)
        try:
            pipe.execute()
        except _REDIS_ERRORS as exc:
            return self._degraded("set_many", exc, [])
        return []

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
              client: Any = None) -> Any:
        return super().touch(key, self._resolve_ttl(timeout), version=version, client=client)

    def persist(self, key: Any, version: int | None = None, client: Any = None) -> Any:
        if not self._allow_no_ttl:
            raise MissingTTLError(
                "persist() would keep the key forever (set OPTIONS['ALLOW_NO_TTL'] = True)"
            )
        return super().persist(key, version=version, client=client)

    # --- reads ------------------------------------------------------------------------

    def _decode_raw(self, raw: Any) -> Any:
        """The stored value, or an :class:`envelope.Entry` for ``get_or_set`` values."""
        if isinstance(raw, bytes) and envelope.is_envelope(raw):
            header, soft_expiry, delta, payload = envelope.split(raw)
            return envelope.Entry(self.client.decode(payload), header, soft_expiry, delta)
        return self.client.decode(raw)

    def _fresh(self, raw: bytes) -> Any:
        """The value of a hit that needs no refresh, else ``_MISSING`` (stale, or XFetch
        picked this caller to recompute early)."""
        if raw[:_MAGIC_LEN] != envelope.MAGIC:
            return self._plain_decode(self.client, raw)
        found = self._decode_raw(raw)
        now = time.time()
        if found.is_stale(now) or found.refresh_early(now, self._policy.beta):
            return _MISSING
        return found.value

    def _visible(self, raw: Any, default: Any) -> Any:
        """What plain ``get`` returns: an envelope past its soft expiry is a miss."""
        found = self._decode_raw(raw)
        if isinstance(found, envelope.Entry):
            return default if found.is_stale(time.time()) else found.value
        return found

    def get(self, key: Any, default: Any = None, version: int | None = None,
            client: Any = None) -> Any:
        if self._herd:
            return super().get(key, default, version, client)
        dr_client = self.client
        nkey = dr_client.make_key(key, version=version)
        if client is None:
            client = dr_client.get_server(nkey) if self._shard else dr_client.get_client(False)
        try:
            raw = client.get(nkey)
        except _REDIS_ERRORS as exc:
            return self._degraded("get", exc, default)
        if raw is None:
            return default
        if raw[:_MAGIC_LEN] != envelope.MAGIC:  # the hit path: django-redis's own decode
            return self._plain_decode(dr_client, raw)
        return self._visible(raw, default)

    def get_many(self, keys: Iterable[Any], version: int | None = None, client: Any = None) -> Any:
        if self._herd or self._shard:
            return super().get_many(keys, version=version, client=client)
        keys = list(keys)
        if not keys:
            return {}
        nkeys = {self.client.make_key(k, version=version): k for k in keys}
        conn = client if client is not None else self.client.get_client(write=False)
        try:
            raws = conn.mget(list(nkeys))
        except _REDIS_ERRORS as exc:
            return self._degraded("get_many", exc, {})
        found = {}
        for nkey, raw in zip(nkeys, raws, strict=True):
            if raw is not None:
                value = self._visible(raw, _MISSING)
                if value is not _MISSING:
                    found[nkeys[nkey]] = value
        return found

    def _degraded(self, operation: str, exc: BaseException, fallback: T) -> T:
        """Redis failed: with IGNORE_EXCEPTIONS log and return ``fallback``, else raise."""
        if not self._ignore_exceptions:
            raise exc
        if self._log_ignored_exceptions and self.logger is not None:
            # The project routed these with DJANGO_REDIS_LOG_IGNORED_EXCEPTIONS/_LOGGER:
            # log exactly as django-redis does, once.
            self.logger.exception("Exception ignored")
        else:
            logger.warning("cache %s failed, continuing without Redis: %s", operation, exc)
        return fallback

    # --- single flight ----------------------------------------------------------------

    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        """Django's ``get_or_set`` with stampede protection: for one expired or missing
        key, the callable runs once across all threads and processes while the others
        wait (bounded) for its value, or get the stale value (``STALE_TTL``). Its
        exception reaches only the caller that ran it. A hit is one GET."""
        if self._herd:
            return super().get_or_set(key, default, timeout, version)
        ttl = self._resolve_ttl(timeout)
        dr_client = self.client
        nkey = dr_client.make_key(key, version=version)
        raw: Any = stampede.UNREAD
        if ttl is None or ttl > 0:
            try:
                raw = (dr_client.get_server(nkey) if self._shard
                       else dr_client.get_client(False)).get(nkey)
            except _REDIS_ERRORS as exc:
                self._degraded("get_or_set", exc, None)
                return _value_of(default)
            if raw is not None:
                hit = self._fresh(raw)
                if hit is not _MISSING:
                    return hit  # the hit path: one GET

        def flow(raw: Any, waited: float = 0.0) -> Any:
            return self._drive(
                stampede.get_or_set_flow(self, key, ttl, nkey, self._policy, raw, waited),
                default)

        if raw is stampede.UNREAD:  # timeout <= 0: compute, store nothing
            return flow(raw)
        if self._lock_elsewhere(nkey):
            # No key can share this key's Cluster slot, so no script can lock it: keep
            # Django's algorithm (get, compute, add) for it rather than fail with CROSSSLOT.
            return super().get_or_set(key, default, timeout, version)
        if raw is not None:  # stale, or XFetch picked us: through the flow, no waiting
            return flow(raw)
        return self._coalesced(key, (repr(self._server), nkey),
                               lambda waited: flow(None, waited))

    def _coalesced(self, key: Any, flight_key: tuple[str, str],
                   run: Callable[[float], Any]) -> Any:
        """Threads of this process that miss the same key share one distributed attempt:
        one leader talks to Redis (claims, or waits on one connection); the others wait
        on a local event and get a copy of its value. A leader's exception is its own:
        the followers then elect a new leader."""
        started = time.monotonic()
        waited = 0.0  # > 0 once we waited for a leader that failed: counts against the wait
        while True:
            with _flights_lock:
                flight = _flights.get(flight_key)
                leader = flight is None
                if flight is None:
                    flight = _flights[flight_key] = _Flight()
            if leader:
                try:
                    flight.value = run(waited)
                    flight.ok = True
                    return flight.value
                finally:
                    with _flights_lock:
                        if _flights.get(flight_key) is flight:
                            del _flights[flight_key]
                    flight.done.set()
            remaining = self._policy.max_wait - (time.monotonic() - started)
            if remaining <= 0:
                return run(self._policy.max_wait)  # computes on its own if still held
            if flight.done.wait(remaining) and flight.ok:
                stampede.report_wait(self, key, started, got_value=True)
                return self._copy(flight.value)
            waited = time.monotonic() - started

    def _copy(self, value: Any) -> Any:
        """A private copy for each caller, as a cache read would give (same serializer)."""
        return self.client.decode(self._encode_bytes(value))

    def _encode_bytes(self, value: Any) -> bytes:
        """``value`` serialized (and compressed) as django-redis would, always bytes, even
        for an int (the envelope and the copies need bytes)."""
        return _serialize(self.client, value)

    def _drive(self, flow: stampede.Flow, default: Any) -> Any:
        reply: Any = None
        computed: Any = _MISSING
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return stop.value
            kind = op[0]
            if kind == "compute":
                try:
                    computed = _value_of(default)
                except BaseException as exc:
                    self._run_settle_quietly(_flow_op_after_throw(flow, exc))
                    _finish_after_release(flow, exc)
                reply = computed
                continue
            try:
                reply = self._run(op)
            except _REDIS_ERRORS as exc:
                if kind == "settle":
                    logger.warning("cache: storing a computed value failed: %s", exc)
                    reply = None
                    continue
                self._degraded("get_or_set", exc, None)
                flow.close()
                if computed is _MISSING:
                    computed = _value_of(default)
                return computed

    def _run_settle_quietly(self, op: stampede.Op | None) -> None:
        if op is None:
            return
        try:
            self._run(op)
        except _REDIS_ERRORS as exc:
            logger.warning("cache: releasing a compute lock failed: %s", exc)

    def _run(self, op: stampede.Op) -> Any:
        kind = op[0]
        if kind == "read":
            return self._reader(op[1]).get(op[1])
        if kind == "wait":
            conn = self._primary(op[1])
            return conn.blmove(op[1], op[1], op[2], "RIGHT", "LEFT") is not None
        keys, args = op[1], op[2]
        return script(f"cache_{kind}")(self._primary(keys[0]), keys, args)

    # --- counters ---------------------------------------------------------------------

    def _incr_args(self, delta: int, must_exist: bool) -> list[Any]:
        ttl = None if self._allow_no_ttl else self._resolve_ttl(DEFAULT_TIMEOUT)
        ttl_ms = 0 if ttl is None else max(1, int(ttl * 1000))
        return [delta, "1" if must_exist else "0", ttl_ms]

    def incr(self, key: Any, delta: int = 1, version: int | None = None, client: Any = None,
             ignore_key_check: bool = False) -> Any:
        """Atomic INCRBY that keeps the TTL (one EVALSHA). Beyond 64 bits, an optimistic
        WATCH/MULTI update, still atomic. A missing key raises ``ValueError``."""
        if self._herd or self._shard:
            return super().incr(key, delta, version=version, client=client,
                                **({"ignore_key_check": True} if ignore_key_check else {}))
        nkey = self.client.make_key(key, version=version)
        conn = client if client is not None else self.client.get_client(write=True)
        try:
            try:
                args = self._incr_args(delta, not ignore_key_check)
                value = script("cache_incr")(conn, [nkey], args)
            except ResponseError:
                value = self._incr_big(conn, nkey, delta)
        except _REDIS_ERRORS as exc:
            return self._degraded("incr", exc, None)
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return value

    def _incr_big(self, conn: Any, nkey: str, delta: int) -> Any:
        from ..connection import is_cluster

        if redis.VERSION < (6,) and is_cluster(conn):  # its Cluster pipelines have no WATCH
            conn = conn.get_redis_connection(conn.get_node_from_key(nkey))  # the key's node
        # transaction=True: a Cluster pipeline only allows WATCH in a transaction
        with conn.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(nkey)
                    raw = pipe.get(nkey)
                    if raw is None:
                        return None
                    value = self.client.decode(raw) + delta
                    pipe.multi()
                    pipe.set(nkey, self.client.encode(value), keepttl=True)
                    pipe.execute()
                    return value
                except WatchError:
                    continue

    def decr(self, key: Any, delta: int = 1, version: int | None = None,
             client: Any = None) -> Any:
        return self.incr(key, -delta, version=version, client=client)

    # --- clear ------------------------------------------------------------------------

    def _clear_pattern(self) -> str:
        return str(self.key_func("*", glob_escape(self.key_prefix), "[-0-9]*"))

    def clear(self) -> None:
        """Delete this cache's keys only (SCAN + UNLINK in batches): sessions, locks and
        other prefixes on the same database survive. ``OPTIONS["CLEAR_FLUSHDB"]`` restores
        django-redis's FLUSHDB."""
        if self._clear_flushdb:
            return super().clear()
        if self._shard:
            conns = list(self.client._serverdict.values())
        else:
            conns = [self.client.get_client(write=True)]
        pattern = self._clear_pattern()
        try:
            for conn in conns:
                batch: list[bytes] = []
                for nkey in conn.scan_iter(match=pattern, count=1000):
                    batch.append(nkey)
                    if len(batch) >= _CLEAR_BATCH:
                        conn.unlink(*batch)
                        batch.clear()
                if batch:
                    conn.unlink(*batch)
        except _REDIS_ERRORS as exc:
            self._degraded("clear", exc, None)
        return None

    # --- async ------------------------------------------------------------------------

    def _async_client(self) -> Any:
        """A redis.asyncio client for this location on the running loop, or None when the
        configuration needs django-redis's sync machinery (sharding, Sentinel, Herd,
        custom connection factories): those run in a thread instead."""
        native = getattr(self, "_native", None)
        if native is None:
            native = self._native = self._native_async_possible()
        if not native:
            return None
        loop = asyncio.get_running_loop()
        url = self.client._server[0]
        key = (url, id(self._options))
        per_loop = _async_clients.setdefault(loop, {})
        aclient = per_loop.get(key)
        if aclient is None:
            aclient = per_loop[key] = self._build_async_client(url)
        return aclient

    def _native_async_possible(self) -> bool:
        from django.conf import settings

        options = self._options
        base = self._client_cls
        if not issubclass(base, DefaultClient) or issubclass(
            base, (HerdClient, ShardClient, SentinelClient)
        ):
            return False
        factory = options.get("CONNECTION_FACTORY") or getattr(
            settings, "DJANGO_REDIS_CONNECTION_FACTORY", None)
        if factory and factory != "django_redis.pool.ConnectionFactory":
            return False
        url = str(self.client._server[0])
        return url.split("://", 1)[0] in ("redis", "rediss", "unix")

    def _build_async_client(self, url: str) -> Any:
        from redis.asyncio.retry import Retry as AsyncRetry

        options = self._options
        kwargs: dict[str, Any] = {
            # Re-send only after a connection error, never after a timeout (SPEC D4).
            "retry": AsyncRetry(NoBackoff(), 1, supported_errors=(RedisConnectionError,)),
            "retry_on_timeout": False,
        }
        for option, name in (("SOCKET_TIMEOUT", "socket_timeout"),
                             ("SOCKET_CONNECT_TIMEOUT", "socket_connect_timeout"),
                             ("PASSWORD", "password"), ("USERNAME", "username")):
            if options.get(option) is not None:
                kwargs[name] = options[option]
        pool_kwargs = options.get("CONNECTION_POOL_KWARGS", {})
        for name, value in pool_kwargs.items():
            if name in ("health_check_interval", "ssl_cert_reqs", "ssl_ca_certs",
                        "ssl_certfile", "ssl_keyfile", "client_name"):
                kwargs[name] = value
        # A blocking pool: a burst of coroutines waits for a connection instead of failing
        # with "Too many connections" (redis.asyncio's default pool holds 100).
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url, max_connections=pool_kwargs.get("max_connections") or ASYNC_MAX_CONNECTIONS,
            timeout=ASYNC_POOL_WAIT, **kwargs,
        )
        return redis.asyncio.Redis(connection_pool=pool)

    async def _acall(self, operation: str, fallback: Any,
                     call: Callable[[Any], Awaitable[T]], sync: Callable[[], T]) -> Any:
        aclient = self._async_client()
        if aclient is None:
            from asgiref.sync import sync_to_async

            return await sync_to_async(sync, thread_sensitive=False)()
        try:
            return await call(aclient)
        except _REDIS_ERRORS as exc:
            return self._degraded(operation, exc, fallback)

    async def aget(self, key: Any, default: Any = None, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> Any:
            raw = await ac.get(nkey)
            return default if raw is None else self._visible(raw, default)

        return await self._acall("get", default, call, lambda: self.get(key, default, version))

    async def aget_many(self, keys: Iterable[Any], version: int | None = None) -> Any:
        keys = list(keys)
        nkeys = {self.client.make_key(k, version=version): k for k in keys}

        async def call(ac: Any) -> Any:
            if not nkeys:
                return {}
            raws = await ac.mget(list(nkeys))
            found = {}
            for nkey, raw in zip(nkeys, raws, strict=True):
                value = _MISSING if raw is None else self._visible(raw, _MISSING)
                if value is not _MISSING:
                    found[nkeys[nkey]] = value
            return found

        return await self._acall("get_many", {}, call, lambda: self.get_many(keys, version))

    async def _awrite(self, key: Any, value: Any, timeout: Any, version: int | None,
                      nx: bool) -> Any:
        ttl = self._resolve_ttl(timeout)
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            if ttl is not None and int(ttl * 1000) <= 0:
                if nx:  # django-redis: add() with timeout <= 0 reports "absent", stores nothing
                    return not await ac.exists(nkey)
                return bool(await ac.delete(nkey))
            px = None if ttl is None else int(ttl * 1000)
            return bool(await ac.set(nkey, self.client.encode(value), nx=nx, px=px))

        def sync() -> Any:
            return super(RedisCache, self).set(key, value, ttl, version=version, nx=nx)

        return await self._acall("set", False, call, sync)

    async def aset(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        return await self._awrite(key, value, timeout, version, nx=False)

    async def aadd(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        return await self._awrite(key, value, timeout, version, nx=True)

    async def adelete(self, key: Any, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            return bool(await ac.delete(nkey))

        return await self._acall("delete", False, call, lambda: self.delete(key, version=version))

    async def ahas_key(self, key: Any, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            return bool(await ac.exists(nkey))

        return await self._acall("has_key", False, call, lambda: self.has_key(key, version))

    async def atouch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT,
                     version: int | None = None) -> Any:
        ttl = self._resolve_ttl(timeout)
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            if ttl is None:
                return bool(await ac.persist(nkey))
            return bool(await ac.pexpire(nkey, int(ttl * 1000)))

        return await self._acall("touch", False, call, lambda: self.touch(key, ttl, version))

    async def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Atomic in async code too (Django's inherited ``aincr`` is GET-then-SET)."""
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> Any:
            try:
                return await script("cache_incr").acall(ac, [nkey], self._incr_args(delta, True))
            except ResponseError:
                return await self._aincr_big(ac, nkey, delta)

        value = await self._acall("incr", None, call, lambda: self.incr(key, delta, version))
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return value

    async def _aincr_big(self, ac: Any, nkey: str, delta: int) -> Any:
        async with ac.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(nkey)
                    raw = await pipe.get(nkey)
                    if raw is None:
                        return None
                    value = self.client.decode(raw) + delta
                    pipe.multi()
                    pipe.set(nkey, self.client.encode(value), keepttl=True)
                    await pipe.execute()
                    return value
                except WatchError:
                    continue

    async def adecr(self, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await self.aincr(key, -delta, version=version)

    async def aget_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        """``get_or_set`` on redis.asyncio; ``default`` may be a callable returning an
        awaitable (an ``async def`` function), which is awaited."""
        aclient = self._async_client() if self._single_flight() else None
        if aclient is None:
            from asgiref.sync import async_to_sync, sync_to_async

            if inspect.iscoroutinefunction(default):
                default = async_to_sync(default)
            return await sync_to_async(self.get_or_set, thread_sensitive=False)(
                key, default, timeout, version)
        ttl = self._resolve_ttl(timeout)
        nkey = self.client.make_key(key, version=version)

        async def flow(raw: Any, waited: float = 0.0) -> Any:
            return await self._adrive(
                aclient,
                stampede.get_or_set_flow(self, key, ttl, nkey, self._policy, raw, waited),
                default)

        if ttl is not None and ttl <= 0:
            return await flow(stampede.UNREAD)
        try:
            raw = await aclient.get(nkey)
        except _REDIS_ERRORS as exc:
            self._degraded("get_or_set", exc, None)
            return await _maybe_await(_value_of(default))
        if raw is not None:
            hit = self._fresh(raw)
            return await flow(raw) if hit is _MISSING else hit
        return await self._acoalesced(key, (repr(self._server), nkey),
                                      lambda waited: flow(None, waited))

    async def _acoalesced(self, key: Any, flight_key: tuple[str, str],
                          run: Callable[[float], Awaitable[Any]]) -> Any:
        """:meth:`_coalesced` for coroutines of one event loop."""
        loop = asyncio.get_running_loop()
        flights = _async_flights.setdefault(loop, {})
        started = time.monotonic()
        waited = 0.0
        while True:
            flight = flights.get(flight_key)
            if flight is None:
                flight = flights[flight_key] = loop.create_future()
                try:
                    value = await run(waited)
                except BaseException:
                    flight.set_result(_FAILED)
                    raise
                else:
                    flight.set_result(value)
                    return value
                finally:
                    if flights.get(flight_key) is flight:
                        del flights[flight_key]
            remaining = self._policy.max_wait - (time.monotonic() - started)
            if remaining <= 0:
                return await run(self._policy.max_wait)
            try:
                value = await asyncio.wait_for(asyncio.shield(flight), remaining)
            except asyncio.TimeoutError:
                value = _FAILED
            if value is not _FAILED:
                stampede.report_wait(self, key, started, got_value=True)
                return self._copy(value)
            waited = time.monotonic() - started

    async def _adrive(self, aclient: Any, flow: stampede.Flow, default: Any) -> Any:
        reply: Any = None
        computed: Any = _MISSING
        while True:
            try:
                op = flow.send(reply)
            except StopIteration as stop:
                return stop.value
            kind = op[0]
            if kind == "compute":
                try:
                    computed = await _maybe_await(_value_of(default))
                except BaseException as exc:
                    await self._arun_settle_quietly(aclient, _flow_op_after_throw(flow, exc))
                    _finish_after_release(flow, exc)
                reply = computed
                continue
            try:
                reply = await self._arun(aclient, op)
            except _REDIS_ERRORS as exc:
                if kind == "settle":
                    logger.warning("cache: storing a computed value failed: %s", exc)
                    reply = None
                    continue
                self._degraded("get_or_set", exc, None)
                flow.close()
                if computed is _MISSING:
                    computed = await _maybe_await(_value_of(default))
                return computed

    async def _arun_settle_quietly(self, aclient: Any, op: stampede.Op | None) -> None:
        if op is None:
            return
        try:
            await self._arun(aclient, op)
        except _REDIS_ERRORS as exc:
            logger.warning("cache: releasing a compute lock failed: %s", exc)

    async def _arun(self, aclient: Any, op: stampede.Op) -> Any:
        kind = op[0]
        if kind == "read":
            return await aclient.get(op[1])
        if kind == "wait":
            return await aclient.blmove(op[1], op[1], op[2], "RIGHT", "LEFT") is not None
        keys, args = op[1], op[2]
        return await script(f"cache_{kind}").acall(aclient, keys, args)


def _value_of(default: Any) -> Any:
    """``get_or_set``'s ``default``: called when callable, as Django does."""
    return default() if callable(default) else default


async def _maybe_await(value: Any) -> Any:
    if inspect.isawaitable(value):
        return await value
    return value


def _flow_op_after_throw(flow: stampede.Flow, exc: BaseException) -> stampede.Op | None:
    """Throw the callable's exception into the flow; return the release it yields."""
    try:
        return flow.throw(exc)
    except StopIteration:  # pragma: no cover - the flow always re-raises
        return None


def _finish_after_release(flow: stampede.Flow, exc: BaseException) -> None:
    """Resume the flow after its release: it re-raises the callable's exception."""
    with contextlib.suppress(StopIteration):
        flow.send(None)
    raise exc  # pragma: no cover - flow.send re-raised it already

