"""How this cache's values and companion keys look in Redis.

One :class:`Codec` per backend. It turns raw bytes into values (plain ``set()`` values in
django-redis's exact format, ``get_or_set`` values in an :mod:`.envelope`), values into
bytes, and a cache key into the names of its lock and wake-up list. The backend, the
single-flight flow, the counters and the async API all read and write through it, so none
of them needs another's internals.
"""

from __future__ import annotations

import functools
import inspect
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from django_redis.client import DefaultClient
from redis.crc import key_slot
from redis.exceptions import ClusterError, TryAgainError

from . import envelope, meta
from .compat import ValidatingKeys

MAGIC_LEN = len(envelope.MAGIC)
MISSING = object()  # "no value" where None is a value
logger = logging.getLogger("django_redispatterns.cache")


def undecodable(raw: Any, exc: BaseException) -> Any:
    """A stored value this cache cannot decode (truncated, or written by a process with
    another serializer or compressor) reads as a miss: logged, never raised, and the
    next write replaces it."""
    logger.warning("cache value of %d bytes cannot be decoded (%s: %s); treated as a miss",
                   len(raw) if isinstance(raw, (bytes, str)) else -1, type(exc).__name__, exc)
    return MISSING


class EnvelopeAwareDecode:
    """Mixed into the configured client class: every django-redis read path (``get``,
    ``incr_version``, ``get_many`` of other client classes...) unwraps an envelope."""

    def decode(self, value: Any) -> Any:
        if isinstance(value, bytes) and envelope.is_envelope(value):
            value = envelope.split(value)[3]
        return super().decode(value)  # type: ignore[misc]


@functools.cache
def client_class(base: type) -> type:
    """``base`` (a django-redis client class) with envelope-aware decoding and Django's
    key validation."""
    return type(base.__name__, (EnvelopeAwareDecode, ValidatingKeys, base),
                {"__module__": base.__module__})


if "allow_int" in inspect.signature(DefaultClient.encode).parameters:  # django-redis >= 7

    def _serialize(client: Any, value: Any) -> bytes:
        return client.encode(value, allow_int=False)

else:  # django-redis 5.4 / 6: encode() passes ints through; this is its non-int branch

    def _serialize(client: Any, value: Any) -> bytes:
        return client._compressor.compress(client._serializer.dumps(value))


def _due(soft_expiry: float, delta: float, beta: float) -> bool:
    """Stale, or XFetch picks this reader to recompute early."""
    now = time.time()
    return now >= soft_expiry or envelope.refresh_early(now, soft_expiry, delta, beta)


class Owner(Protocol):
    """What a codec reads of its backend, at each call (django-redis builds ``client``
    lazily, and tests may replace it)."""

    client: Any
    key_prefix: str


class Codec:
    """Values and key names of one cache. ``plain_decode`` is the configured client
    class's own ``decode`` (the hit path skips the envelope check it already made)."""

    def __init__(self, owner: Owner, plain_decode: Callable[[Any, Any], Any], *,
                 stale_reads: bool = False) -> None:
        self._owner = owner
        self._plain_decode = plain_decode
        # STALE_TTL keeps get_or_set values past their timeout: plain reads then fetch
        # each key's metadata too (same MGET) so that an expired value stays a miss.
        self.stale_reads = stale_reads

    def _client(self) -> Any:
        return self._owner.client

    def plain(self, raw: bytes) -> Any:
        """A value written by plain ``set()`` (no envelope), decoded as django-redis does
        (:data:`MISSING` when it cannot be decoded)."""
        try:
            return self._plain_decode(self._owner.client, raw)
        except Exception as exc:  # any serializer's or compressor's error: a miss
            return undecodable(raw, exc)

    def decode(self, raw: Any, metadata: Any = None) -> Any:
        """The stored value, or an :class:`envelope.Entry` for ``get_or_set`` values: a
        plain value whose companion ``metadata`` describes it, or an envelope written by
        0.1.0 (:data:`MISSING` when it cannot be decoded)."""
        client = self._owner.client
        try:
            if isinstance(raw, bytes) and envelope.is_envelope(raw):
                header, soft_expiry, delta, payload = envelope.split(raw)
                return envelope.Entry(client.decode(payload), header, soft_expiry, delta)
            found = meta.times(metadata, raw) if isinstance(raw, bytes) else None
            if found is not None:
                return envelope.Entry(client.decode(raw), metadata, *found)
            return client.decode(raw)
        except Exception as exc:  # any serializer's or compressor's error: a miss
            return undecodable(raw, exc)

    def value(self, raw: Any) -> Any:
        """The stored value, an envelope unwrapped (for read-modify-write callers)."""
        return self._owner.client.decode(raw)

    def visible(self, raw: Any, default: Any, metadata: Any = None) -> Any:
        """What plain ``get`` returns: a ``get_or_set`` value past its soft expiry (kept
        for ``STALE_TTL``) is a miss."""
        found = self.decode(raw, metadata)
        if found is MISSING:
            return default
        if isinstance(found, envelope.Entry):
            return default if found.is_stale(time.time()) else found.value
        return found

    def read_keys(self, nkeys: Any) -> list[Any]:
        """What a plain read MGETs for the Redis keys ``nkeys``: the keys, then their
        metadata keys when ``stale_reads``."""
        nkeys = list(nkeys)
        return nkeys + [self.meta_key(k) for k in nkeys] if self.stale_reads else nkeys

    def found(self, nkeys: dict[Any, Any], raws: list[Any]) -> dict[Any, Any]:
        """``get_many``'s answer: ``{key: value}`` for each Redis key of ``nkeys`` (Redis key
        -> the caller's key) whose raw value in ``raws`` (the MGET of :meth:`read_keys`)
        is visible."""
        values = {}
        count = len(nkeys)
        records = raws[count:] if self.stale_reads else [None] * count
        for nkey, raw, record in zip(nkeys, raws[:count], records, strict=True):
            value = MISSING if raw is None else self.visible(raw, MISSING, record)
            if value is not MISSING:
                values[nkeys[nkey]] = value
        return values

    def fresh(self, raw: bytes, beta: float, metadata: Any = None) -> Any:
        """The value of a hit that needs no refresh, else :data:`MISSING` (stale, or
        XFetch picked this caller to recompute early). ``metadata``: the value's
        companion record (``None``, or one that does not describe ``raw``: a plain hit)."""
        if raw[:MAGIC_LEN] != envelope.MAGIC:
            found = meta.times(metadata, raw)
            if found is not None and _due(*found, beta):
                return MISSING
            return self.plain(raw)
        if len(raw) < envelope.HEADER_LEN:  # a truncated envelope
            return MISSING
        if _due(*envelope.times(raw), beta):
            return MISSING
        return self.plain(raw[envelope.HEADER_LEN:])

    def encode(self, value: Any) -> bytes:
        """``value`` serialized (and compressed) as django-redis would, always bytes, even
        for an int (the envelope and the copies need bytes)."""
        return _serialize(self._client(), value)

    def encode_plain(self, value: Any) -> Any:
        """``value`` exactly as django-redis's ``set()`` stores it."""
        return self._client().encode(value)

    def copy(self, value: Any) -> Any:
        """A private copy for each caller, as a cache read would give (same serializer)."""
        return self._client().decode(self.encode(value))

    def companion(self, nkey: str, kind: str) -> str:
        """A key of ours next to cache key ``nkey``: same hash slot (a script touches
        both on Redis Cluster), inside this cache's KEY_PREFIX, and outside the
        ``prefix:version:*`` space that ``keys()``, ``delete_pattern()`` and ``clear()``
        walk. The hash tag is ``nkey``'s own tag, or ``nkey`` itself when it has none."""
        nkey = str(nkey)
        prefix = self._owner.key_prefix
        open_at = nkey.find("{")
        close_at = nkey.find("}", open_at + 1) if open_at >= 0 else -1
        if open_at >= 0 and close_at > open_at + 1:
            candidate = f"{prefix}:{{{nkey[open_at + 1:close_at]}}}:rp-{kind}:{nkey}"
        else:
            candidate = f"{prefix}:{{{nkey}}}:rp-{kind}"
        if key_slot(candidate.encode()) == key_slot(nkey.encode()):
            return candidate
        # A key with a lone '}' and no tag cannot be co-located; fine on one node.
        return f"{prefix}:rp-{kind}:{nkey}"

    def meta_key(self, nkey: str) -> str:
        """The companion key holding ``get_or_set``'s metadata for ``nkey``."""
        return self.companion(nkey, meta.KIND)

    def hit_keys(self, nkey: str) -> list[str]:
        """What a ``get_or_set`` hit reads, in one MGET: the value and its metadata."""
        return [nkey, self.meta_key(nkey)]

    @staticmethod
    def read_pair(conn: Any, nkeys: list[str]) -> list[Any]:
        """MGET of a key and its companion; one GET each when Redis Cluster refuses the
        multi-key read because a slot migration has them on two nodes for a moment."""
        try:
            return list(conn.mget(nkeys))
        except (TryAgainError, ClusterError):
            return [conn.get(nkey) for nkey in nkeys]

    def shares_slot(self, nkey: str) -> bool:
        """True when ``nkey``'s lock can share its Redis Cluster slot."""
        return self.companion(nkey, "lock").startswith(f"{self._owner.key_prefix}:{{")
