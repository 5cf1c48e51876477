"""Where django-redis's contract differs from Django's, Django's wins (docs/cache.md,
"Differences from Django's Redis backend"):

* every key a public method takes is checked like Django's backends check it: a key
  memcached would reject (longer than 250 characters, or with a space or control
  character) gives a ``CacheKeyWarning``, and a backend's own ``validate_key`` override is
  honoured (:class:`ValidatingKeys`, mixed into the configured django-redis client, whose
  ``make_key`` every key-taking method goes through);
* Django's ``OPTIONS["serializer"]`` works, as django-redis's ``SERIALIZER``
  :class:`DjangoSerializer`;
* ``incr_version``/``decr_version`` move a key whose value is ``None`` too, byte for byte,
  with its remaining TTL to the millisecond, and ``get_backend_timeout`` answers in
  seconds like Django's Redis backend (:class:`DjangoContract`).
"""

from __future__ import annotations

import re
from typing import Any, Protocol, TypeVar

from asgiref.sync import sync_to_async
from django.core.cache.backends.base import DEFAULT_TIMEOUT, MEMCACHE_MAX_KEY_LENGTH, BaseCache
from django.utils.module_loading import import_string
from django_redis.client.default import CacheKey
from django_redis.serializers.base import BaseSerializer

from ..connection.cacheoptions import DJANGO_SERIALIZER_OPTION
from .failures import REDIS_ERRORS

T = TypeVar("T")

# Django's memcache_key_warnings flags characters below 33 and 127.
_MEMCACHE_UNSAFE = re.compile(r"[\x00-\x20\x7f]")


def check_key(backend: BaseCache, key: str) -> None:
    """Django's key validation of a made key (prefix and version included): warnings come
    from ``backend.validate_key``. Keys Django's default validation accepts are recognised
    without calling it (one regex search), unless the backend overrides it."""
    if (type(backend).validate_key is BaseCache.validate_key
            and len(key) <= MEMCACHE_MAX_KEY_LENGTH and not _MEMCACHE_UNSAFE.search(key)):
        return
    backend.validate_key(key)


class ValidatingKeys:
    """Mixed into the configured client class: ``make_key`` validates what it made."""

    _backend: Any

    def make_key(self, key: Any, version: int | None = None, prefix: str | None = None) -> Any:
        if isinstance(key, CacheKey):  # made (and checked) already
            return key
        made = super().make_key(key, version=version, prefix=prefix)  # type: ignore[misc]
        check_key(self._backend, str(made))
        return made


class Backend(Protocol):
    client: Any
    version: int
    _shard: bool

    def _resolve_ttl(self, timeout: Any) -> float | None: ...
    def _degraded(self, operation: str, exc: BaseException, fallback: T) -> T: ...


class DjangoContract:
    """Django's semantics where django-redis's differ (mixed into the backend)."""

    def get_backend_timeout(self, timeout: Any = DEFAULT_TIMEOUT) -> float | None:
        """Django's Redis backend's answer: seconds from now (0 or more), ``None`` for
        "never expires" (which the TTL policy may refuse when writing)."""
        if timeout is DEFAULT_TIMEOUT:
            timeout = self.default_timeout  # type: ignore[attr-defined]
        return None if timeout is None else max(0, int(timeout))

    def incr_version(self: Backend, key: Any, delta: int = 1, version: int | None = None,
                     client: Any = None) -> Any:
        """Move ``key`` from ``version`` to ``version + delta`` and return the new version.

        The stored bytes move unchanged (a ``None`` value, a ``get_or_set`` envelope and
        its staleness included) with the remaining TTL; a missing key raises ``ValueError``.
        Three round trips (read, write, delete), like Django's: the two names may live on
        different Cluster slots or shards, so no single script can move it.
        """
        if version is None:
            version = self.version
        dr_client = self.client
        old = dr_client.make_key(key, version=version)
        new = dr_client.make_key(key, version=version + delta)

        def conn(nkey: Any) -> Any:
            if client is not None:
                return client
            return dr_client.get_server(nkey) if self._shard else dr_client.get_client(True)

        try:
            with conn(old).pipeline(transaction=False) as pipe:
                raw, pttl = pipe.get(old).pttl(old).execute()
            if raw is None or pttl == -2:
                raise ValueError(f"Key {key!r} not found")
            ttl = pttl / 1000 if pttl > 0 else self._resolve_ttl(None)  # -1: no TTL
            conn(new).set(new, raw, px=None if ttl is None else max(1, int(ttl * 1000)))
            conn(old).delete(old)
        except REDIS_ERRORS as exc:
            return self._degraded("incr_version", exc, None)
        return version + delta

    def decr_version(self, key: Any, delta: int = 1, version: int | None = None,
                     client: Any = None) -> Any:
        return self.incr_version(key, -delta, version=version,  # type: ignore[misc]
                                 client=client)

    async def aincr_version(self, key: Any, delta: int = 1,
                            version: int | None = None) -> Any:
        """:meth:`incr_version` in a thread (Django's default would reset the TTL)."""
        return await sync_to_async(self.incr_version)(key, delta, version)  # type: ignore[misc]


class DjangoSerializer(BaseSerializer):
    """A serializer of Django's Redis backend (``OPTIONS["serializer"]``: a dotted path,
    a class or an instance with ``dumps``/``loads``) as a django-redis ``SERIALIZER``."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options=options)
        serializer = options[DJANGO_SERIALIZER_OPTION]
        if isinstance(serializer, str):
            serializer = import_string(serializer)
        if callable(serializer):
            serializer = serializer()
        self._serializer = serializer

    def dumps(self, value: Any) -> bytes:
        data = self._serializer.dumps(value)  # Django's own stores an int as the int
        return bytes(data) if isinstance(data, (bytes, bytearray)) else str(data).encode()

    def loads(self, value: bytes) -> Any:
        return self._serializer.loads(value)
