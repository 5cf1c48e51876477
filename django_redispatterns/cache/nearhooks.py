"""The backend's near-cache hooks: :func:`with_near_cache` decorates ``RedisCache``.

It wraps the class's own methods (so the class body stays as it is). With
``OPTIONS["NEAR_CACHE"]`` unset, ``self._near`` is ``None`` and each wrapper is one
attribute test before the backend's own method. With it set:

* ``get`` and ``get_or_set`` answer from process memory when they can, and fill it on a
  miss (:class:`.near.NearCache`); so do ``aget`` (filling in a worker thread) and
  ``aget_or_set`` (local hits only; its misses take the usual path);
* every write this process makes through the cache API drops the local entries it
  touches *after* Redis acknowledged it (also when it raised: it may have run) and
  before it returns, so this process reads its own writes. Writes the API cannot name
  keys for (``clear``, ``delete_pattern``, ``incr_version``) empty the local store.
  Writes by other processes, or by other commands, arrive through the tracking channel.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar

from django.core.cache.backends.base import DEFAULT_TIMEOUT, BaseCache
from django_redis.client import DefaultClient

from . import envelope
from .codec import MISSING
from .failures import REDIS_ERRORS
from .near import NearCache

T = TypeVar("T")

# method -> how its keys are named: "key" (one), "keys" (an iterable), "data" (a dict's
# keys) or "all" (empty the store).
_WRITES = {
    "set": "key", "add": "key", "delete": "key", "touch": "key", "incr": "key",
    "expire": "key", "expire_at": "key", "pexpire": "key", "pexpire_at": "key",
    "persist": "key", "delete_many": "keys", "set_many": "data", "clear": "all",
    "delete_pattern": "all", "incr_version": "all",
    "aset": "key", "aadd": "key", "adelete": "key", "atouch": "key", "aincr": "key",
}


def with_near_cache(cls: type[T]) -> type[T]:
    """Wrap ``cls``'s reads and writes with the near cache (module docstring)."""
    wrapped: dict[str, Callable[..., Any]] = {
        "get": _get(cls.get),  # type: ignore[attr-defined]
        "get_or_set": _get_or_set(cls.get_or_set),  # type: ignore[attr-defined]
        "aget": _aget(cls.aget),  # type: ignore[attr-defined]
        "aget_or_set": _aget_or_set(cls.aget_or_set),  # type: ignore[attr-defined]
    }
    for name, method in wrapped.items():
        setattr(cls, name, method)
    for name, kind in _WRITES.items():
        setattr(cls, name, _write(name, kind, getattr(cls, name)))
    return cls


def _get(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def get(self: Any, key: Any, default: Any = None, version: int | None = None,
            client: Any = None) -> Any:
        near: NearCache | None = self._near
        if near is None or client is not None or not near.wants(key):
            return orig(self, key, default, version, client)
        nkey = str(self.client.make_key(key, version=version))  # validated
        entry = near.lookup(nkey)
        if entry is not None:  # the hit path: no Redis, one deserialization
            return near.decode(entry[2])
        try:
            found = near.fetch(nkey)
        except REDIS_ERRORS as exc:
            return self._degraded("get", exc, default)
        if found is None:
            return default
        if found[2] is not None or envelope.is_envelope(found[0]):  # maybe stale already
            return self._codec.visible(found[0], default, found[2])
        return near.decode(found[1])

    return get


def _aget(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def aget(self: Any, key: Any, default: Any = None, version: int | None = None) -> Any:
        near: NearCache | None = self._near
        if near is None or not near.wants(key):
            return await orig(self, key, default, version)
        if self._aclients.get() is None:  # no native asyncio client: django-redis in a thread
            return await orig(self, key, default, version)
        nkey = str(self.client.make_key(key, version=version))
        entry = near.lookup(nkey)
        if entry is not None:
            return near.decode(entry[2])
        try:
            found = await near.afetch(nkey)
        except REDIS_ERRORS as exc:
            return self._degraded("get", exc, default)
        if found is None:
            return default
        if found[2] is not None or envelope.is_envelope(found[0]):
            return self._codec.visible(found[0], default, found[2])
        return near.decode(found[1])

    return aget


def _aget_or_set(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    async def aget_or_set(self: Any, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                          version: int | None = None) -> Any:
        near: NearCache | None = self._near
        if near is None or not near.wants(key):
            return await orig(self, key, default, timeout, version)
        nkey = str(self.client.make_key(key, version=version))
        entry = near.lookup(nkey)
        if entry is not None:  # a local hit; a miss takes the usual path, without filling
            hit = self._codec.fresh(entry[0], self._flight.policy.beta)
            if hit is not MISSING:
                return hit
        try:
            return await orig(self, key, default, timeout, version)
        finally:
            near.forget([nkey])

    return aget_or_set


def _get_or_set(orig: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(orig)
    def get_or_set(self: Any, key: Any, default: Any, timeout: Any = DEFAULT_TIMEOUT,
                   version: int | None = None) -> Any:
        near: NearCache | None = self._near
        if near is None or not near.wants(key):
            return orig(self, key, default, timeout, version)
        nkey = str(self.client.make_key(key, version=version))
        entry = near.lookup(nkey)
        # A local copy of a get_or_set value ends at its soft expiry (no early refresh
        # from memory); a value read from Redis comes with its metadata.
        raw, record = (None, None) if entry is None else (entry[0], None)
        if raw is None:
            try:
                found = near.fetch(nkey)
            except REDIS_ERRORS:
                found = None  # the backend's own path reports it
            raw, record = (None, None) if found is None else (found[0], found[2])
        if raw is not None:
            hit = self._codec.fresh(raw, self._flight.policy.beta, record)
            if hit is not MISSING:
                return hit
        # Missing, stale, or XFetch picked this caller: the stampede-safe path decides.
        try:
            return orig(self, key, default, timeout, version)
        finally:
            near.forget([nkey])

    return get_or_set


def _forget(self: Any, kind: str, bound: inspect.BoundArguments) -> None:
    near: NearCache = self._near
    if kind == "all":
        near.forget_all()
        return
    args = bound.arguments
    keys = ([args["key"]] if kind == "key"
            else list(args["data"] if kind == "data" else args["keys"]))
    version = args.get("version")
    wanted = [self.make_key(k, version=version) for k in keys if near.wants(k)]
    if wanted:
        near.forget(wanted)


def _write(name: str, kind: str, orig: Callable[..., Any]) -> Callable[..., Any]:
    # django-redis's backend methods take ``*args, **kwargs``; its client's (sync) and
    # Django's (async) have the real parameter names.
    source = BaseCache if name.startswith("a") else DefaultClient
    signature = inspect.signature(getattr(source, name))

    if inspect.iscoroutinefunction(orig):
        @functools.wraps(orig)
        async def amethod(self: Any, *args: Any, **kwargs: Any) -> Any:
            if self._near is None:
                return await orig(self, *args, **kwargs)
            try:
                return await orig(self, *args, **kwargs)
            finally:
                _forget(self, kind, signature.bind_partial(self, *args, **kwargs))

        return amethod

    @functools.wraps(orig)
    def method(self: Any, *args: Any, **kwargs: Any) -> Any:
        if self._near is None:
            return orig(self, *args, **kwargs)
        try:
            return orig(self, *args, **kwargs)
        finally:
            _forget(self, kind, signature.bind_partial(self, *args, **kwargs))

    return method
