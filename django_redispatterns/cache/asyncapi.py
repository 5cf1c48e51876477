"""The async half of the backend's Django API, native on ``redis.asyncio``.

``aget``, ``aget_many``, ``aset``, ``aadd``, ``adelete``, ``ahas_key``, ``atouch``,
``aincr``, ``adecr`` and ``aget_or_set`` talk to Redis on the running event loop (no
thread hop) where :class:`~.aops.AsyncClients` has a native client, and otherwise run
their sync twin in a thread. Mixed into :class:`~.backend.RedisCache`; it uses the
backend's parts (codec, TTL policy, counters, single flight) and nothing else of it.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Iterable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django_redis.cache import RedisCache as DjangoRedisCache

from .codec import MISSING
from .failures import REDIS_ERRORS
from .flight import maybe_await, value_of

if TYPE_CHECKING:
    from .aops import AsyncClients
    from .codec import Codec
    from .counters import Counters
    from .flight import SingleFlight
    from .ttl import TtlPolicy

T = TypeVar("T")
_SKIPPED = object()  # a fallback no Redis reply can be


class Backend(Protocol):
    """What these methods use of the backend they are mixed into."""

    client: Any
    default_timeout: Any
    _aclients: AsyncClients
    _codec: Codec
    _counters: Counters
    _flight: SingleFlight
    _ttl: TtlPolicy

    def _single_flight(self) -> bool: ...
    def _degraded(self, operation: str, exc: BaseException, fallback: T) -> T: ...
    def _acall(self, operation: str, fallback: Any, call: Callable[[Any], Awaitable[Any]],
               sync: Callable[[], Any]) -> Awaitable[Any]: ...
    def _awrite(self, key: Any, value: Any, timeout: Any, version: int | None,
                nx: bool) -> Awaitable[Any]: ...
    def aincr(self, key: Any, delta: int = 1, version: int | None = None) -> Awaitable[Any]: ...
    def aset(self, key: Any, value: Any, timeout: Any = ...,
             version: int | None = None) -> Awaitable[Any]: ...
    def get(self, key: Any, default: Any = None, version: int | None = None) -> Any: ...
    def get_many(self, keys: Iterable[Any], version: int | None = None) -> Any: ...
    def delete(self, key: Any, version: int | None = None) -> Any: ...
    def has_key(self, key: Any, version: int | None = None) -> Any: ...
    def touch(self, key: Any, timeout: Any = ..., version: int | None = None) -> Any: ...
    def incr(self, key: Any, delta: int = 1, version: int | None = None) -> Any: ...
    def get_or_set(self, key: Any, default: Any, timeout: Any = ...,
                   version: int | None = None) -> Any: ...


class AsyncMethods:
    """Django's ``a*`` cache methods; see the module docstring."""

    async def _acall(self: Backend, operation: str, fallback: Any,
                     call: Callable[[Any], Awaitable[T]], sync: Callable[[], T]) -> Any:
        aclient = self._aclients.get()
        if aclient is None:
            from asgiref.sync import sync_to_async

            return await sync_to_async(sync, thread_sensitive=False)()
        try:
            return await call(aclient)
        except REDIS_ERRORS as exc:
            return self._degraded(operation, exc, fallback)

    async def aget(self: Backend, key: Any, default: Any = None, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> Any:
            if self._codec.stale_reads:
                raw, record = await ac.mget(self._codec.read_keys([nkey]))
            else:
                raw, record = await ac.get(nkey), None
            return default if raw is None else self._codec.visible(raw, default, record)

        return await self._acall("get", default, call, lambda: self.get(key, default, version))

    async def aget_many(self: Backend, keys: Iterable[Any], version: int | None = None) -> Any:
        keys = list(keys)
        nkeys = {self.client.make_key(k, version=version): k for k in keys}

        async def call(ac: Any) -> Any:
            if not nkeys:
                return {}
            return self._codec.found(nkeys, await ac.mget(self._codec.read_keys(nkeys)))

        return await self._acall("get_many", {}, call, lambda: self.get_many(keys, version))

    async def _awrite(self: Backend, key: Any, value: Any, timeout: Any, version: int | None,
                      nx: bool) -> Any:
        ttl = self._ttl.resolve(timeout, self.default_timeout)
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            if ttl is not None and int(ttl * 1000) <= 0:
                if nx:  # django-redis: add() with timeout <= 0 reports "absent", stores nothing
                    return not await ac.exists(nkey)
                return bool(await ac.delete(nkey))
            px = None if ttl is None else int(ttl * 1000)
            return bool(await ac.set(nkey, self._codec.encode_plain(value), nx=nx, px=px))

        def sync() -> Any:  # django-redis's own set: the TTL is resolved already
            return DjangoRedisCache.set(self, key, value, ttl, version=version, nx=nx)

        return await self._acall("set", False, call, sync)

    async def aset(self: Backend, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        return await self._awrite(key, value, timeout, version, nx=False)

    async def aset_many(self: Backend, data: dict[Any, Any], timeout: Any = DEFAULT_TIMEOUT,
                        version: int | None = None) -> list[Any]:
        """The keys not stored, as ``set_many`` answers (Django's inherited ``aset_many``
        answers ``[]`` whatever happened). Once one write fails, the rest are not tried: a
        dead or hung Redis costs one socket timeout, not one per key."""
        keys = list(data)
        for i, key in enumerate(keys):
            if not await self.aset(key, data[key], timeout=timeout, version=version):
                return keys[i:]
        return []

    async def aadd(self: Backend, key: Any, value: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        return await self._awrite(key, value, timeout, version, nx=True)

    async def adelete(self: Backend, key: Any, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            return bool(await ac.delete(nkey))

        return await self._acall("delete", False, call, lambda: self.delete(key, version=version))

    async def ahas_key(self: Backend, key: Any, version: int | None = None) -> Any:
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            return bool(await ac.exists(nkey))

        return await self._acall("has_key", False, call, lambda: self.has_key(key, version))

    async def atouch(self: Backend, key: Any, timeout: Any = DEFAULT_TIMEOUT,
                     version: int | None = None) -> Any:
        ttl = self._ttl.resolve(timeout, self.default_timeout)
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> bool:
            if ttl is None:
                return bool(await ac.persist(nkey))
            return bool(await ac.pexpire(nkey, int(ttl * 1000)))

        return await self._acall("touch", False, call, lambda: self.touch(key, ttl, version))

    async def aincr(self: Backend, key: Any, delta: int = 1, version: int | None = None) -> Any:
        """Atomic in async code too (Django's inherited ``aincr`` is GET-then-SET)."""
        nkey = self.client.make_key(key, version=version)

        async def call(ac: Any) -> Any:
            return await self._counters.aincr(ac, nkey, delta)

        value = await self._acall("incr", _SKIPPED, call, lambda: self.incr(key, delta, version))
        if value is _SKIPPED:
            return None  # Redis failed (IGNORE_EXCEPTIONS): no count, as incr() answers
        if value is None:
            raise ValueError(f"Key {key!r} not found")
        return value

    async def adecr(self: Backend, key: Any, delta: int = 1, version: int | None = None) -> Any:
        return await self.aincr(key, -delta, version=version)

    async def aget_or_set(self: Backend, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        """``get_or_set`` on redis.asyncio; ``default`` may be a callable returning an
        awaitable (an ``async def`` function), which is awaited."""
        aclient = self._aclients.get() if self._single_flight() else None
        if aclient is None:
            from asgiref.sync import async_to_sync, sync_to_async

            if inspect.iscoroutinefunction(default):
                default = async_to_sync(default)
            return await sync_to_async(self.get_or_set, thread_sensitive=False)(
                key, default, timeout, version)
        ttl = self._ttl.resolve(timeout, self.default_timeout)
        nkey = self.client.make_key(key, version=version)
        if ttl is not None and ttl <= 0:  # Django: compute, store nothing
            return await maybe_await(value_of(default))
        try:
            raw, record = await aclient.mget(self._codec.hit_keys(nkey))
        except REDIS_ERRORS as exc:
            self._degraded("get_or_set", exc, None)
            return await maybe_await(value_of(default))
        if raw is not None:
            hit = self._codec.fresh(raw, self._flight.policy.beta, record)
            if hit is not MISSING:
                return hit
        return await self._flight.amiss(aclient, key, nkey, ttl, default,
                                        None if raw is None else (raw, record))
