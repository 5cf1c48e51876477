"""``@cached`` (memoize a function behind ``get_or_set``) and ``invalidate_on_commit``."""

from __future__ import annotations

import functools
import inspect
import logging
from collections.abc import Callable
from typing import Any, TypeVar, cast

from django.core.cache import caches
from django.core.cache.backends.base import DEFAULT_TIMEOUT
from django.db import transaction

from . import argkey

logger = logging.getLogger("django_redispatterns.cache")

F = TypeVar("F", bound=Callable[..., Any])


def cached(
    timeout: Any = DEFAULT_TIMEOUT,
    key: str | Callable[..., str] | None = None,
    *,
    cache: str = "default",
    version: int | None = None,
) -> Callable[[F], F]:
    """Memoize a function (sync or ``async def``) in cache alias ``cache``.

    ``key`` names the entry of a call:

    * a ``str.format`` template filled with the call's arguments (``key="report:{0}"``,
      ``key="user:{user_id}"``, ``key="order:{0.pk}"``);
    * a callable taking the same arguments and returning the key;
    * omitted: the function's dotted name plus a digest of the arguments' *identity*
      (:mod:`.argkey`): saved model instances by model, database and primary key, plain
      values by a type-tagged encoding. Positional and keyword spellings of one call
      share the entry.
      Any other argument type (and an unsaved model instance) raises
      :class:`~django_redispatterns.exceptions.UncacheableArgument`, a ``TypeError``,
      before the function runs: ``repr()`` is not identity, so two different objects
      that print alike would read each other's results.

    With this package's backend the function runs once per expiry across all processes
    (see ``get_or_set``), and a ``None`` result is cached like any other. The wrapper
    gains ``.invalidate(*args, **kwargs)`` / ``await .ainvalidate(...)`` (delete the entry
    those arguments produce) and ``.cache_key(*args, **kwargs)``.
    """

    def decorate(fn: F) -> F:
        name = f"{fn.__module__}.{fn.__qualname__}"
        signature = inspect.signature(fn)

        def cache_key(*args: Any, **kwargs: Any) -> str:
            if callable(key):
                return key(*args, **kwargs)
            if key is not None:
                try:
                    return key.format(*args, **kwargs)
                except (IndexError, KeyError) as exc:
                    raise TypeError(
                        f"@cached key template {key!r} of {name} needs argument {exc}"
                    ) from None
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            return f"cached:{name}:{argkey.digest(bound.arguments)}"

        if inspect.iscoroutinefunction(fn):

            @functools.wraps(fn)
            async def async_wrapper(*args: Any, **kwargs: Any) -> Any:
                return await caches[cache].aget_or_set(
                    cache_key(*args, **kwargs), lambda: fn(*args, **kwargs), timeout, version
                )

            wrapper: Any = async_wrapper
        else:

            @functools.wraps(fn)
            def sync_wrapper(*args: Any, **kwargs: Any) -> Any:
                return caches[cache].get_or_set(
                    cache_key(*args, **kwargs), lambda: fn(*args, **kwargs), timeout, version
                )

            wrapper = sync_wrapper

        def invalidate(*args: Any, **kwargs: Any) -> bool:
            return bool(caches[cache].delete(cache_key(*args, **kwargs), version=version))

        async def ainvalidate(*args: Any, **kwargs: Any) -> bool:
            return bool(await caches[cache].adelete(cache_key(*args, **kwargs), version=version))

        wrapper.invalidate = invalidate
        wrapper.ainvalidate = ainvalidate
        wrapper.cache_key = cache_key
        return cast(F, wrapper)

    return decorate


def invalidate_on_commit(
    *keys: str, using: str | None = None, cache: str = "default", version: int | None = None
) -> None:
    """Delete ``keys`` from cache alias ``cache`` once the current transaction on database
    ``using`` commits — at once when no transaction is open, never if it rolls back.

    Write the database first, then invalidate: a reader that misses afterwards recomputes
    from committed data. (Deleting before the commit lets a concurrent reader cache the
    old rows again; writing the new value into the cache races with other writers.)
    """
    if not keys:
        return
    backend = caches[cache]

    def invalidate() -> None:
        try:
            backend.delete_many(list(keys), version=version)
        except Exception:
            # The transaction committed; the entries expire with their TTL.
            logger.exception("cache invalidation of %r after commit failed", keys)
            raise

    transaction.on_commit(invalidate, using=using)
