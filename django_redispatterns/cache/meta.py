"""The metadata ``get_or_set`` keeps beside a plain value, in a companion key.

``get_or_set`` stores its value under the cache key exactly as django-redis's ``set()``
would (configured serializer and compressor, the same bytes), so any process of the fleet
— django-redis, Django's own Redis backend, an older release of this package — reads it as
the value. What early recomputation (XFetch) and stale-while-revalidate need lives in a
companion key in the same hash slot (see :meth:`.codec.Codec.companion`), with the same
lifetime as the value:

``MAGIC + pack(">ddII", soft_expiry, delta, length, crc32)``

``soft_expiry`` is the Unix time after which the value is stale (``inf``: never), ``delta``
the seconds its computation took, and ``length`` / ``crc32`` fingerprint the value's
stored bytes. A hit reads both keys in one MGET. When the fingerprint does not match the
value (another process wrote the key with a plain ``set()`` since), the metadata is not
the value's: it is a plain hit, with no early recomputation — never a wrong value.
"""

from __future__ import annotations

import math
import struct
import time
import zlib
from typing import Any

MAGIC = b"\x00\x93rm1"
_META = struct.Struct(">ddII")
SIZE = len(MAGIC) + _META.size
KIND = "meta"  # the companion key's kind: ``<prefix>:{<key>}:rp-meta``


def stored_bytes(value: Any) -> bytes:
    """The bytes Redis keeps for what django-redis's ``encode`` returned (redis-py's
    encoding: bytes as they are, text as UTF-8, numbers as their repr)."""
    if isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode()
    return repr(value).encode()


def pack(stored: bytes, ttl: float | None, delta: float, now: float | None = None) -> bytes:
    """The metadata of ``stored`` (the value's bytes in Redis), fresh for ``ttl`` seconds."""
    soft_expiry = math.inf if ttl is None else (time.time() if now is None else now) + ttl
    return MAGIC + _META.pack(soft_expiry, delta, len(stored) & 0xFFFFFFFF,
                              zlib.crc32(stored))


def times(meta: Any, raw: bytes) -> tuple[float, float] | None:
    """``(soft_expiry, delta)`` when ``meta`` is well formed and describes ``raw``; else
    ``None`` (no metadata, a truncated record, or the value was rewritten since)."""
    if not isinstance(meta, bytes) or len(meta) != SIZE or meta[: len(MAGIC)] != MAGIC:
        return None
    soft_expiry, delta, length, crc = _META.unpack_from(meta, len(MAGIC))
    if length != len(raw) & 0xFFFFFFFF or crc != zlib.crc32(raw):
        return None
    return soft_expiry, delta
