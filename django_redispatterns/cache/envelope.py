"""The value format ``get_or_set`` wrote in 0.1.0: metadata and payload in one string.

This release stores ``get_or_set`` values plain, with their metadata in a companion key
(:mod:`.meta`); it still reads entries in this format (left by a 0.1.0 process during an
upgrade) as before, and :class:`Entry` describes both.

``MAGIC + pack(">dd", soft_expiry, delta) + payload`` where ``payload`` is exactly what
django-redis would have stored (its serializer, then its compressor), ``soft_expiry`` is the
Unix time after which the entry is stale (``inf``: never) and ``delta`` the seconds the last
computation took (XFetch's δ). One GET returns all three, so a hit stays one round trip.

``MAGIC`` starts with a NUL byte followed by a byte no serializer django-redis ships can
produce there (pickle starts with ``0x80``, JSON with printable text, a msgpack value that
starts with ``0x00`` is the single byte ``0x00``), so plain ``set()`` values — which keep
django-redis's exact bytes — are never mistaken for an envelope.
"""

from __future__ import annotations

import math
import random
import struct
import time
from dataclasses import dataclass
from typing import Any

MAGIC = b"\x00\x93rp1"
_META = struct.Struct(">dd")
HEADER_LEN = len(MAGIC) + _META.size


@dataclass(frozen=True)
class Entry:
    """A decoded envelope: the value and what XFetch and stale-while-revalidate need."""

    value: Any
    header: bytes  # the raw metadata bytes, used as a compare-token by the claim script
    soft_expiry: float
    delta: float

    def is_stale(self, now: float) -> bool:
        return now >= self.soft_expiry

    def servable(self, now: float, stale_ttl: float) -> bool:
        """May ``get_or_set`` serve it while another caller refreshes it: fresh, or
        expired less than ``stale_ttl`` seconds ago."""
        return now < self.soft_expiry + stale_ttl

    def refresh_early(self, now: float, beta: float) -> bool:
        return refresh_early(now, self.soft_expiry, self.delta, beta)


def refresh_early(now: float, soft_expiry: float, delta: float, beta: float) -> bool:
    """XFetch (Vattani et al., VLDB 2015): ``now - δ·β·ln(U) >= expiry``, U ~ (0, 1].

    Expected early recomputations per expiry stay about one however many readers there
    are, and they happen earlier for values that take longer to compute.
    """
    if beta <= 0 or delta <= 0 or math.isinf(soft_expiry):
        return False
    return now - delta * beta * math.log(1.0 - random.random()) >= soft_expiry


def is_envelope(raw: bytes) -> bool:
    return raw[: len(MAGIC)] == MAGIC


def times(raw: bytes) -> tuple[float, float]:
    """``(soft_expiry, delta)`` of an envelope, without decoding its payload."""
    soft_expiry, delta = _META.unpack_from(raw, len(MAGIC))
    return soft_expiry, delta


def pack(payload: bytes, ttl: float | None, delta: float, now: float | None = None) -> bytes:
    """Wrap django-redis's encoded ``payload`` with its soft expiry and compute time."""
    soft_expiry = math.inf if ttl is None else (time.time() if now is None else now) + ttl
    return MAGIC + _META.pack(soft_expiry, delta) + payload


def split(raw: bytes) -> tuple[bytes, float, float, bytes]:
    """``(header, soft_expiry, delta, payload)`` of an envelope (check :func:`is_envelope`)."""
    soft_expiry, delta = _META.unpack_from(raw, len(MAGIC))
    return raw[:HEADER_LEN], soft_expiry, delta, raw[HEADER_LEN:]
