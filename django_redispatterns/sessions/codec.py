"""Signing session data: byte-for-byte Django's ``signing.dumps(..., compress=True)`` format.

TimestampSigner, HMAC-SHA256, ``SECRET_KEY_FALLBACKS`` honoured, with the HMAC key derived
once per (salt, secret) instead of on every call, and zlib tried only when it can pay off.
Data written by either side reads on the other (tests/test_sessions.py checks both ways).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import time
import zlib

from django.conf import settings
from django.core import signing

COMPRESS_MIN_BYTES = 200


@functools.lru_cache(maxsize=32)
def _hmac_key(salt: str, secret: str | bytes) -> bytes:
    # django.utils.crypto.salted_hmac(key_salt=salt + "signer", secret=secret).
    raw = secret.encode() if isinstance(secret, str) else secret
    return hashlib.sha256((salt + "signer").encode() + raw).digest()


def _signature(salt: str, value: str, secret: str | bytes) -> str:
    digest = hmac.digest(_hmac_key(salt, secret), value.encode(), "sha256")
    return signing.b64_encode(digest).decode()


def sign_session(data: bytes, salt: str) -> str:
    """``signing.dumps(obj, salt=salt, serializer=..., compress=True)`` for serialized ``data``."""
    prefix = ""
    if len(data) >= COMPRESS_MIN_BYTES:
        compressed = zlib.compress(data)
        if len(compressed) < len(data) - 1:
            data, prefix = compressed, "."
    value = f"{prefix}{signing.b64_encode(data).decode()}:{signing.b62_encode(int(time.time()))}"
    return f"{value}:{_signature(salt, value, settings.SECRET_KEY)}"


def unsign_session(signed: str, salt: str) -> bytes:
    """The serialized data of a ``signing.dumps`` value; ``BadSignature`` if not genuine."""
    value, _, sig = signed.rpartition(":")
    if not value:
        raise signing.BadSignature("no signature")
    for secret in (settings.SECRET_KEY, *settings.SECRET_KEY_FALLBACKS):
        if hmac.compare_digest(sig.encode(), _signature(salt, value, secret).encode()):
            break
    else:
        raise signing.BadSignature("signature does not match")
    payload = value.rpartition(":")[0].encode()  # drop the timestamp (no max_age)
    if payload[:1] == b".":
        return zlib.decompress(signing.b64_decode(payload[1:]))
    return signing.b64_decode(payload)
