"""The Redis operations behind idempotency records: one script or command each, no decisions.

Bytes go in and Redis' replies come out. A claim that Redis cannot answer raises
:class:`BackendUnavailable` (nothing can be promised then); the other calls let
``redis.RedisError`` pass through (the view already ran: callers log and go on). Every write
is one of the owner-checked scripts in ``lua/idempotency_*.lua``: completing, releasing and
renewing act only while the key still holds *our* pending value, so a worker whose lease
ran out can neither overwrite, free nor prolong the claim of the worker that took over.
Each script is safe to run twice (a call re-sent after a lost reply changes nothing more).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import redis

from .. import connection, keys, scripts
from ..exceptions import BackendUnavailable

FEATURE = "idem"


def record_key(digest: str) -> str:
    """The Redis key of the record named by ``digest``."""
    return keys.make_key(FEATURE, digest)


def claim(conn: str, redis_key: str, pending: bytes, lease_ms: int) -> Any:
    """``SET NX PX`` the pending value: ``1`` if taken, else the record that holds the key,
    or ``[0, pttl]`` when something we did not write holds it."""
    try:
        return scripts.script("idempotency_claim")(
            connection.client_for(conn), [redis_key], [pending, lease_ms])
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc


async def aclaim(conn: str, redis_key: str, pending: bytes, lease_ms: int) -> Any:
    """Async twin of :func:`claim`."""
    try:
        return await scripts.script("idempotency_claim").acall(
            connection.async_client_for(conn), [redis_key], [pending, lease_ms])
    except redis.RedisError as exc:
        raise _unavailable(exc) from exc


def _unavailable(exc: redis.RedisError) -> BackendUnavailable:
    return BackendUnavailable(f"Redis unavailable for idempotency: {exc}")


def complete(conn: str, redis_key: str, pending: bytes, value: bytes, ttl_ms: int) -> bool:
    """Replace our pending value with the stored response ``value`` for ``ttl_ms``."""
    return bool(scripts.script("idempotency_complete")(
        connection.client_for(conn), [redis_key], [pending, value, ttl_ms]))


async def acomplete(conn: str, redis_key: str, pending: bytes, value: bytes,
                    ttl_ms: int) -> bool:
    """Async twin of :func:`complete`."""
    return bool(await scripts.script("idempotency_complete").acall(
        connection.async_client_for(conn), [redis_key], [pending, value, ttl_ms]))


def release(conn: str, redis_key: str, pending: bytes) -> bool:
    """Delete our pending value."""
    return bool(scripts.script("idempotency_release")(
        connection.client_for(conn), [redis_key], [pending]))


async def arelease(conn: str, redis_key: str, pending: bytes) -> bool:
    """Async twin of :func:`release`."""
    return bool(await scripts.script("idempotency_release").acall(
        connection.async_client_for(conn), [redis_key], [pending]))


def extend(conn: str, redis_key: str, pending: bytes, lease_ms: int) -> bool:
    """Set our pending value's TTL to ``lease_ms`` from now."""
    return bool(scripts.script("idempotency_extend")(
        connection.client_for(conn), [redis_key], [pending, lease_ms]))


def read(conn: str, redis_key: str) -> tuple[bytes | None, int]:
    """The value and its PTTL (one pipeline)."""
    pipe = connection.client_for(conn).pipeline(transaction=False)
    pipe.get(redis_key)
    pipe.pttl(redis_key)
    value, pttl = pipe.execute()
    return value, int(pttl)


def delete(conn: str, redis_key: str) -> bool:
    return bool(connection.client_for(conn).delete(redis_key))


def scan(conn: str, count: int = 500) -> Iterable[bytes]:
    """Every idempotency key name under this app's prefix (SCAN, never KEYS)."""
    client = connection.client_for(conn)
    return client.scan_iter(match=keys.feature_pattern(FEATURE), count=count)
