"""``django_redispatterns.cache.RedisCache``: django-redis's backend, extended.

Everything django-redis does keeps working (the same client classes, serializers,
compressors, replicas, ``IGNORE_EXCEPTIONS``, ``ttl``/``expire``/``lock``/``delete_pattern``);
on top of it this backend guarantees:

* every write has a TTL (``timeout=None`` raises :class:`MissingTTLError` unless
  ``OPTIONS["ALLOW_NO_TTL"]``), optionally jittered downwards (``OPTIONS["TTL_JITTER"]``)
  — :mod:`.ttl`;
* ``get_or_set``/``aget_or_set`` compute a missing value once across threads and
  processes, refresh hot values early (XFetch) and serve stale values while one caller
  recomputes (``OPTIONS["STALE_TTL"]``) — :mod:`.flight`, :mod:`.stampede`;
* ``incr``/``decr``/``aincr``/``adecr`` are one atomic command that keeps the TTL —
  :mod:`.counters`;
* ``clear()`` deletes only this cache's ``KEY_PREFIX`` (SCAN + UNLINK in batches), and
  only when the key function provably scopes every key — :mod:`.scope`;
* django-redis's extras keep the rules: set/hash/sorted-set writes get a TTL in the same
  round trip, ``lock()`` is leased and fenced, ``keys()`` uses SCAN — :mod:`.inherited`;
* the ``a*`` methods run on ``redis.asyncio`` (no thread hop) for single-URL locations —
  :mod:`.asyncapi`.

This class is the Django API only: it resolves keys and timeouts and hands each call to
the part that does it. The hit paths (``get``, ``get_or_set``) stay inline: one GET.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

from django.conf import settings
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django_redis.cache import RedisCache as DjangoRedisCache
from django_redis.client import HerdClient, ShardClient
from django_redis.exceptions import ConnectionInterrupted

from ..connection.cacheoptions import translate
from ..connection.tls import with_tls_pool_kwargs
from ..exceptions import ConfigurationError
from ..tracking.config import read_config
from . import envelope, options, stampede
from .aops import AsyncClients
from .asyncapi import AsyncMethods
from .codec import MAGIC_LEN, MISSING, Codec, client_class, undecodable
from .compat import DjangoContract
from .counters import Counters
from .failures import REDIS_ERRORS, degrade
from .flight import SingleFlight, value_of
from .inherited import InheritedMethods
from .near import shared as shared_near_cache
from .nearhooks import with_near_cache
from .ops import RedisOps
from .ttl import TtlPolicy

T = TypeVar("T")


@with_near_cache
class RedisCache(DjangoContract, InheritedMethods, AsyncMethods, DjangoRedisCache):
    """django-redis's ``RedisCache`` with TTL discipline and stampede protection.

    OPTIONS: every django-redis option; the Django-style ones of Django's own Redis
    backend (``db``, ``socket_timeout``, ``pool_class``, ...; mapped to django-redis's,
    see :mod:`django_redispatterns.connection.cacheoptions`); and ``ALLOW_NO_TTL`` (False),
    ``TTL_JITTER``
    (0.0, a fraction), ``STALE_TTL`` (0 s), ``XFETCH_BETA`` (1.0; 0 turns it off),
    ``STAMPEDE_LEASE`` (10 s), ``STAMPEDE_WAIT`` (2 x lease), ``CLEAR_FLUSHDB`` (False).
    """

    # Django-style OPTIONS ("db", "socket_timeout", ...) are mapped, not ignored
    # (connection.cacheoptions); the checks and the connection builders read this flag.
    DJANGO_STYLE_OPTIONS = True
    # The OPTIONS it reads besides django-redis's; the checks refuse any other (a subclass
    # that reads more extends this).
    OWN_OPTIONS: frozenset[str] = options.OWN_OPTIONS

    def __init__(self, server: str, params: dict[str, Any]) -> None:
        self._settings_entry = (server, params.get("KEY_PREFIX", ""), params.get("OPTIONS"))
        server, opts = translate(server, params.get("OPTIONS", {}))
        opts = with_tls_pool_kwargs(server, opts)
        params = {**params, "OPTIONS": opts}
        super().__init__(server, params)
        own = options.read(opts)
        self._ttl = TtlPolicy(allow_no_ttl=own.allow_no_ttl, jitter=own.jitter)
        self._clear_flushdb = own.clear_flushdb
        self._lock_keys = own.lock_keys
        self._options = opts
        # django-redis builds its client from this class (lazily, in its ``client``
        # property, which tests may patch): the same class plus envelope-aware decode.
        base: type = self._client_cls  # type: ignore[has-type]
        self._herd = issubclass(base, HerdClient)
        self._shard = issubclass(base, ShardClient)
        self._client_cls = client_class(base)
        # The hit path calls django-redis's own decode, skipping the envelope-aware wrapper.
        self._plain_decode = base.decode  # type: ignore[attr-defined]
        self._codec = Codec(self, self._plain_decode, stale_reads=own.policy.stale_ttl > 0)
        self._ops = RedisOps(self, shard=self._shard)
        self._aclients = AsyncClients(self, opts, self._client_cls)
        self._counters = Counters(
            self._codec, lambda: self._ttl.counter_ttl_ms(self.default_timeout))
        self._flight = SingleFlight(self._codec, self._ops, own.policy,
                                    stampede.Reporter(self), self._degraded, repr(server))
        near = read_config(opts.get("NEAR_CACHE"))
        if near is not None and (self._herd or self._shard):
            raise ConfigurationError("CACHES OPTIONS['NEAR_CACHE'] needs django-redis's "
                                     "DefaultClient (not HerdClient or ShardClient).")
        self._near = None if near is None else shared_near_cache(self, near, server, opts)

    def _single_flight(self) -> bool:
        # HerdClient stores its own packed tuples; it is superseded by this backend, so
        # with it get_or_set keeps Django's behaviour instead of mixing the two formats.
        return not self._herd

    def _degraded(self, operation: str, exc: BaseException, fallback: T) -> T:
        """Redis failed: with IGNORE_EXCEPTIONS log and return ``fallback``, else raise."""
        return degrade(self, operation, exc, fallback)

    # --- TTL discipline ---------------------------------------------------------------

    def _resolve_ttl(self, timeout: Any) -> float | None:
        return self._ttl.resolve(timeout, self.default_timeout)

    def _write(self, operation: str, fallback: T, call: Callable[[], T]) -> T:
        """``call()`` on django-redis's client; a Redis failure degrades to ``fallback``
        (with ``IGNORE_EXCEPTIONS``; without it the redis-py error is raised). django-redis's
        own wrappers answer None for every failed write, and some (``touch``) let the error
        through: a skipped write must say so (False, or the keys not stored)."""
        try:
            return call()
        except ConnectionInterrupted as exc:
            return self._degraded(operation, exc.__cause__ or exc, fallback)
        except REDIS_ERRORS as exc:
            return self._degraded(operation, exc, fallback)

    def set(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
            client: Any = None, nx: bool = False, xx: bool = False) -> Any:
        ttl = self._resolve_ttl(timeout)
        return self._write("set", False, lambda: self.client.set(
            key, value, ttl, version=version, client=client, nx=nx, xx=xx))

    def add(self, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
            client: Any = None) -> Any:
        ttl = self._resolve_ttl(timeout)
        return self._write("add", False, lambda: self.client.add(
            key, value, ttl, version=version, client=client))

    def delete(self, key: Any, version: int | None = None, prefix: str | None = None,
               client: Any = None) -> Any:
        return self._write("delete", False, lambda: bool(self.client.delete(
            key, version=version, prefix=prefix, client=client)))

    def set_many(self, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                 version: int | None = None, client: Any = None) -> Any:
        """Django's contract: the list of keys that were not stored (all of them when
        Redis failed and ``IGNORE_EXCEPTIONS`` is on)."""
        ttl = self._resolve_ttl(timeout)

        def store() -> list[Any]:
            if not self._ttl.jitter or self._shard:
                self.client.set_many(data, ttl, version=version, client=client)
            else:  # each key its own jitter, still one round trip
                self._ops.set_each(data, lambda: self._resolve_ttl(timeout), version)
            return []

        return self._write("set_many", list(data), store)

    def touch(self, key: Any, timeout: Any = DEFAULT_TIMEOUT, version: int | None = None,
              client: Any = None) -> Any:
        ttl = self._resolve_ttl(timeout)
        return self._write("touch", False, lambda: self.client.touch(
            key, ttl, version=version, client=client))

    def persist(self, key: Any, version: int | None = None, client: Any = None) -> Any:
        self._ttl.check_persist()
        return super().persist(key, version=version, client=client)

    # --- reads ------------------------------------------------------------------------

    def get(self, key: Any, default: Any = None, version: int | None = None,
            client: Any = None) -> Any:
        if self._herd:
            return super().get(key, default, version, client)
        dr_client = self.client
        nkey = dr_client.make_key(key, version=version)
        if client is None:
            client = dr_client.get_server(nkey) if self._shard else dr_client.get_client(False)
        try:
            if self._codec.stale_reads:
                raw, record = self._codec.read_pair(client, self._codec.read_keys([nkey]))
            else:
                raw, record = client.get(nkey), None
        except REDIS_ERRORS as exc:
            return self._degraded("get", exc, default)
        if raw is None:
            return default
        if record is None and raw[:MAGIC_LEN] != envelope.MAGIC:
            # the hit path: django-redis's own decode
            try:
                return self._plain_decode(dr_client, raw)
            except Exception as exc:  # undecodable (truncated, another serializer): a miss
                undecodable(raw, exc)
                return default
        return self._codec.visible(raw, default, record)

    def get_many(self, keys: Iterable[Any], version: int | None = None, client: Any = None) -> Any:
        if self._herd or self._shard:
            return super().get_many(keys, version=version, client=client)
        keys = list(keys)
        if not keys:
            return {}
        nkeys = {self.client.make_key(k, version=version): k for k in keys}
        conn = client if client is not None else self.client.get_client(write=False)
        try:
            raws = conn.mget(self._codec.read_keys(nkeys))
        except REDIS_ERRORS as exc:
            return self._degraded("get_many", exc, {})
        return self._codec.found(nkeys, raws)

    # --- single flight ----------------------------------------------------------------

    def get_or_set(self, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        """Django's ``get_or_set`` with stampede protection: for one expired or missing
        key, the callable runs once across all threads and processes while the others
        wait (bounded) for its value, or get the stale value (``STALE_TTL``). Its
        exception reaches only the caller that ran it. A hit is one MGET of the value
        and its metadata (one round trip)."""
        if self._herd:
            return super().get_or_set(key, default, timeout, version)
        ttl = self._resolve_ttl(timeout)
        dr_client = self.client
        nkey = dr_client.make_key(key, version=version)
        if ttl is not None and ttl <= 0:  # Django: compute, store nothing
            return value_of(default)
        try:
            raw, record = self._codec.read_pair(
                dr_client.get_server(nkey) if self._shard else dr_client.get_client(False),
                self._codec.hit_keys(nkey))
        except REDIS_ERRORS as exc:
            self._degraded("get_or_set", exc, None)
            return value_of(default)
        seen = None if raw is None else (raw, record)
        if raw is not None:
            hit = self._codec.fresh(raw, self._flight.policy.beta, record)
            if hit is not MISSING:
                return hit  # the hit path: one MGET
        if not self._codec.shares_slot(nkey) and self._ops.on_cluster(nkey):
            # No key can share this key's Cluster slot, so no script can lock it: keep
            # Django's algorithm (get, compute, add) for it rather than fail with CROSSSLOT.
            return super().get_or_set(key, default, timeout, version)
        return self._flight.miss(key, nkey, ttl, default, seen)

    def _own_alias(self) -> str | None:
        """The CACHES alias configured as this backend (its lock connection), if any."""
        for alias, entry in settings.CACHES.items():
            if (entry.get("LOCATION", ""), entry.get("KEY_PREFIX", ""),
                    entry.get("OPTIONS")) == self._settings_entry:
                return str(alias)
        return None

    def _companion_key(self, nkey: str, kind: str) -> str:
        """The name of cache key ``nkey``'s lock (``kind="lock"``) or wake-up list."""
        return self._codec.companion(nkey, kind)

    # --- counters ---------------------------------------------------------------------

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
            value = self._counters.incr(conn, nkey, delta, must_exist=not ignore_key_check)
        except REDIS_ERRORS as exc:
            return self._degraded("incr", exc, None)
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return value

    def decr(self, key: Any, delta: int = 1, version: int | None = None,
             client: Any = None) -> Any:
        return self.incr(key, -delta, version=version, client=client)

    # --- clear ------------------------------------------------------------------------

    def clear(self) -> None:
        """Delete this cache's keys only (SCAN + UNLINK in batches): sessions, locks and
        other prefixes on the same database survive. A ``KEY_FUNCTION`` that does not
        scope every key by prefix and version raises :class:`UnscopedKeysError` and
        deletes nothing (:mod:`.scope`). ``OPTIONS["CLEAR_FLUSHDB"]`` restores
        django-redis's FLUSHDB."""
        if self._clear_flushdb:
            return super().clear()
        pattern = self._own_pattern("clear()")
        try:
            self._ops.unlink_matching(pattern)
        except REDIS_ERRORS as exc:
            self._degraded("clear", exc, None)
        return None
