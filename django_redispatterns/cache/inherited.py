"""django-redis's extra methods, held to the cache's house rules (docs/cache.md,
"Inherited methods").

django-redis 7 adds set, hash and sorted-set commands, ``lock()``, ``keys()`` and
``delete_pattern()`` to the Django API. As inherited they would write keys that never
expire, hand out a lock without a lease, send ``KEYS`` (which blocks the server for the
whole keyspace) and delete by a pattern the key function may have widened to ``*``.
:class:`InheritedMethods` (mixed into :class:`~.backend.RedisCache`) overrides them:

* every method that can *create* a key (``sadd``, ``smove``, ``sdiffstore``,
  ``sinterstore``, ``sunionstore``, ``hset``, ``zadd``, ``zincrby``) sends its command and
  a ``PEXPIRE`` in one ``MULTI``/``EXEC`` round trip: the key gets the cache's default
  timeout, or the ``timeout=`` the call passes (``None`` refused with
  :class:`~django_redispatterns.exceptions.MissingTTLError` unless ``ALLOW_NO_TTL``);
  every write restarts the lifetime, as ``set()`` does;
* ``lock()`` returns a :class:`CacheLock`, this package's leased, fenced
  :class:`~django_redispatterns.locks.Lock` (default lease ``LOCKS["TTL"]``), kept under
  django-redis's own key for the name (``OPTIONS["LOCK_KEYS"]``), so a django-redis
  process and this one exclude each other during a rolling deploy;
* ``keys()`` walks with ``SCAN``;
* ``delete_pattern()`` runs only when the cache can prove which keys are its own
  (:mod:`.scope`), like ``clear()``.

Methods that only read or remove (``srem``, ``spop``, ``hdel``, ``zrem``, ``zpop*``,
``zremrangebyscore``...) cannot create a key and keep django-redis's code.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django_redis.cache import RedisCache as DjangoRedisCache
from redis.exceptions import RedisClusterException

from ..exceptions import ConfigurationError
from ..locks import Lock
from . import scope
from .failures import REDIS_ERRORS

if TYPE_CHECKING:
    from .ops import RedisOps
    from .ttl import TtlPolicy

T = TypeVar("T")


class Backend(Protocol):
    """What these methods use of the backend they are mixed into."""

    client: Any
    default_timeout: Any
    key_prefix: str
    key_func: Callable[..., Any]
    _ops: RedisOps
    _ttl: TtlPolicy
    _clear_flushdb: bool
    _lock_keys: str
    _codec: Any

    def _own_alias(self) -> str | None: ...

    def _degraded(self, operation: str, exc: BaseException, fallback: T) -> T: ...
    def _own_pattern(self, operation: str) -> str: ...
    def _with_ttl(self, operation: str, nkey: Any, timeout: Any, client: Any,
                  send: Callable[[Any], Any], fallback: Any = None) -> Any: ...


class CacheLock(Lock):
    """What ``cache.lock()`` returns: a :class:`~django_redispatterns.locks.Lock` that also
    takes redis-py's ``acquire(blocking, blocking_timeout)`` arguments.

    Its lease ends ``timeout`` seconds after it was taken or extended (a crashed or hung
    holder frees the lock once its lease ends) and it carries a fencing token;
    Where its lease lives is ``OPTIONS["LOCK_KEYS"]``: ``"django-redis"`` (the default)
    keeps it in django-redis's own key for the name, on the cache's server — a django-redis
    ``cache.lock(name)`` (redis-py's ``SET NX``) and this one exclude each other, and
    ``cache.has_key(name)`` is True while it is held; its fencing counter and wake-up keys
    sit beside it (same Cluster slot, outside the ``keys()``/``clear()`` space).
    ``"patterns"`` keeps the 0.1.0 layout: the locks' own keys on the locks' connection.
    """

    def place(self, held: str, companion: Callable[[str], str], connection: str) -> CacheLock:
        """Keep this lock's lease in ``held`` on ``connection`` (a CACHES alias), its
        fencing counter, waiting marker and wake-up list in ``companion(kind)``."""
        target = dataclasses.replace(
            self._store.target, held_keys=[held], fence_keys=[companion("lock-fence")],
            waiting_keys=[companion("lock-waiting")], wake_keys=[companion("lock-wake")],
            connections=[connection])
        self._held_keys, self._fence_keys = target.held_keys, target.fence_keys
        self._store = type(self._store)(target)
        return self

    def acquire(self, wait: float | None = None, blocking_timeout: float | None = None, *,
                blocking: bool | None = None, token: Any = None) -> bool:
        """Take the lock: ``acquire(wait=seconds)`` as :meth:`Lock.acquire`, or redis-py's
        ``acquire(blocking=False)`` (no wait), ``acquire(True, blocking_timeout=5)``."""
        if token is not None:
            raise TypeError("cache.lock(): the token is made by the lock, not passed in")
        if isinstance(wait, bool):  # redis-py's first positional argument is `blocking`
            blocking, wait = wait, None
        if blocking is False:
            wait = 0.0
        elif blocking_timeout is not None:
            wait = blocking_timeout
        return super().acquire(wait)


class InheritedMethods:
    """Overrides of django-redis's extras; see the module docstring."""

    # --- the shared write: command + PEXPIRE in one MULTI ------------------------------

    def _with_ttl(self: Backend, operation: str, nkey: Any, timeout: Any, client: Any,
                  send: Callable[[Any], Any], fallback: Any = None) -> Any:
        """Run ``send(pipe)`` (one command on ``nkey``) and give ``nkey`` its TTL, in one
        MULTI/EXEC: the key never exists without a lifetime. Returns the command's reply."""
        ttl = self._ttl.resolve(timeout, self.default_timeout)
        conn = client if client is not None else self._ops.primary(nkey)
        try:
            try:
                pipe = conn.pipeline(transaction=True)
            except RedisClusterException as exc:  # redis-py before 6: no MULTI on Cluster
                raise ConfigurationError(
                    f"cache.{operation}() on Redis Cluster sends the command and its PEXPIRE "
                    f"in one MULTI, which this redis-py cannot do ({exc}); use redis-py 6 "
                    "or later") from exc
            send(pipe)
            if ttl is not None:
                pipe.pexpire(nkey, max(1, int(ttl * 1000)) if ttl > 0 else 0)
            return pipe.execute()[0]
        except REDIS_ERRORS as exc:
            return self._degraded(operation, exc, fallback)

    # --- sets --------------------------------------------------------------------------

    def sadd(self: Backend, key: Any, *values: Any, version: int | None = None,
             client: Any = None, timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """SADD, and the set's TTL (``timeout``, default the cache's) in the same MULTI."""
        nkey = self.client.make_key(key, version=version)
        encoded = [self.client.encode(v) for v in values]
        reply = self._with_ttl("sadd", nkey, timeout, client,
                               lambda pipe: pipe.sadd(nkey, *encoded))
        return None if reply is None else int(reply)

    def smove(self: Backend, source: Any, destination: Any, member: Any,
              version: int | None = None, client: Any = None,
              timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """SMOVE; the destination (which SMOVE may create) gets its TTL in the same MULTI.
        Like django-redis, ``version`` applies to ``source`` only."""
        nsource = self.client.make_key(source, version=version)
        ndest = self.client.make_key(destination)
        encoded = self.client.encode(member)
        reply = self._with_ttl("smove", ndest, timeout, client,
                               lambda pipe: pipe.smove(nsource, ndest, encoded))
        return None if reply is None else bool(reply)

    def _store(self: Backend, command: str, dest: Any, keys: tuple[Any, ...],
               dest_version: int | None, keys_version: int | None, client: Any,
               timeout: Any) -> Any:
        ndest = self.client.make_key(dest, version=dest_version)
        nkeys = [self.client.make_key(k, version=keys_version) for k in keys]
        reply = self._with_ttl(command, ndest, timeout, client,
                               lambda pipe: getattr(pipe, command)(ndest, *nkeys))
        return None if reply is None else int(reply)

    def sdiffstore(self: Any, dest: Any, *keys: Any, version_dest: int | None = None,
                   version_keys: int | None = None, client: Any = None,
                   timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """SDIFFSTORE; ``dest`` gets its TTL in the same MULTI."""
        return self._store("sdiffstore", dest, keys, version_dest, version_keys, client,
                           timeout)

    def sinterstore(self: Any, dest: Any, *keys: Any, version: int | None = None,
                    client: Any = None, timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """SINTERSTORE; ``dest`` gets its TTL in the same MULTI."""
        return self._store("sinterstore", dest, keys, version, version, client, timeout)

    def sunionstore(self: Any, destination: Any, *keys: Any, version: int | None = None,
                    client: Any = None, timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """SUNIONSTORE; ``destination`` gets its TTL in the same MULTI."""
        return self._store("sunionstore", destination, keys, version, version, client,
                           timeout)

    # --- hashes and sorted sets ---------------------------------------------------------

    def hset(self: Backend, key: Any, field: Any = None, value: Any = None,
             mapping: Mapping[Any, Any] | None = None, version: int | None = None,
             client: Any = None, timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """HSET (one field, or ``mapping``); the hash gets its TTL in the same MULTI."""
        nkey = self.client.make_key(key, version=version)
        encoded_value = self.client.encode(value) if value is not None else None
        encoded_mapping = (None if mapping is None
                           else {f: self.client.encode(v) for f, v in mapping.items()})
        reply = self._with_ttl("hset", nkey, timeout, client, lambda pipe: pipe.hset(
            nkey, key=field, value=encoded_value, mapping=encoded_mapping))
        return None if reply is None else int(reply)

    def zadd(self: Backend, key: Any, mapping: dict[Any, float], nx: bool = False,
             xx: bool = False, ch: bool = False, incr: bool = False, gt: bool = False,
             lt: bool = False, version: int | None = None, client: Any = None,
             timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """ZADD; the sorted set gets its TTL in the same MULTI."""
        nkey = self.client.make_key(key, version=version)
        encoded = {self.client.encode(m, allow_int=False): s for m, s in mapping.items()}
        return self._with_ttl("zadd", nkey, timeout, client, lambda pipe: pipe.zadd(
            nkey, encoded, nx=nx, xx=xx, ch=ch, incr=incr, gt=gt, lt=lt))

    def zincrby(self: Backend, key: Any, amount: float, value: Any,
                version: int | None = None, client: Any = None,
                timeout: Any = DEFAULT_TIMEOUT) -> Any:
        """ZINCRBY; the sorted set gets its TTL in the same MULTI."""
        nkey = self.client.make_key(key, version=version)
        member = self.client.encode(value, allow_int=False)
        return self._with_ttl("zincrby", nkey, timeout, client,
                              lambda pipe: pipe.zincrby(nkey, amount, member))

    # --- lock, keys, delete_pattern ------------------------------------------------------

    def lock(self: Backend, key: Any, version: int | None = None, timeout: float | None = None,
             sleep: float = 0.1, blocking: bool = True, blocking_timeout: float | None = None,
             client: Any = None, thread_local: bool = True, *,
             auto_renew: bool = False) -> CacheLock:
        """A leased, fenced lock named after this cache's key for ``key``.

        ``timeout`` is the lease (default ``REDIS_PATTERNS["LOCKS"]["TTL"]``): the lock is
        free again ``timeout`` seconds after it was taken (or last ``extend()``-ed) even if
        its holder crashed, hung or forgot it; ``auto_renew=True`` renews it while held
        instead. ``blocking``/``blocking_timeout`` set how long ``acquire()`` and ``with``
        wait (``blocking=True`` without a timeout: until the lock is free). It lives on the
        locks' connection (``LOCKS["CONNECTION"]``). ``sleep`` and ``thread_local`` are
        accepted and unused (waiters are woken, not polling; one instance is one holder,
        whichever thread releases it)."""
        if client is not None:
            raise TypeError("cache.lock() takes no client=: the lock lives on the locks' "
                            "connection (REDIS_PATTERNS['LOCKS']['CONNECTION'])")
        wait = 0.0 if not blocking else (
            math.inf if blocking_timeout is None else float(blocking_timeout))
        nkey = str(self.client.make_key(key, version=version))
        lock = CacheLock(nkey, ttl=timeout, wait=wait, auto_renew=auto_renew)
        alias = self._own_alias()
        if self._lock_keys == "patterns" or self._ops.shard or alias is None:
            return lock
        return lock.place(nkey, lambda kind: self._codec.companion(nkey, kind), alias)

    def keys(self: Backend, search: str, version: int | None = None,
             client: Any = None) -> list[Any]:
        """The keys matching ``search``, found with SCAN (never ``KEYS``, which blocks the
        server while it walks the whole keyspace); each key once."""
        pattern = self.client.make_pattern(search, version=version)
        if client is not None:
            conns = [client]
        elif self._ops.shard:
            conns = self._ops.every_primary()
        else:
            conns = [self.client.get_client(write=False)]
        found: dict[Any, None] = {}
        try:
            for conn in conns:
                for raw in conn.scan_iter(match=pattern, count=1000):
                    name = raw.decode() if isinstance(raw, bytes) else raw
                    found[self.client.reverse_key(name)] = None
        except REDIS_ERRORS as exc:
            return self._degraded("keys", exc, [])
        return list(found)

    def delete_pattern(self: Any, *args: Any, **kwargs: Any) -> Any:
        """django-redis's ``delete_pattern``, refused (:class:`UnscopedKeysError`, nothing
        deleted) when the cache cannot prove which keys are its own (:mod:`.scope`)."""
        if not self._clear_flushdb:
            self._own_pattern("delete_pattern()")
        return DjangoRedisCache.delete_pattern(self, *args, **kwargs)

    def _own_pattern(self: Any, operation: str) -> str:
        """The SCAN pattern of this cache's own keys (proved once per backend)."""
        cached: str | None = self.__dict__.get("_scope_pattern")
        if cached is None:
            cached = scope.own_pattern(self.key_func, self.key_prefix, operation)
            self.__dict__["_scope_pattern"] = cached
        return cached
