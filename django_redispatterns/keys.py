"""The only place that builds Redis key names.

Every key this app writes is ``<KEY_PREFIX>:<feature>:...``; identities that come from
users (IP addresses, user ids where needed, idempotency keys, API-key headers) pass
through :func:`identity_hash` first (a keyed HMAC, so an IPv4 address cannot be
recovered by hashing all 2**32 of them), and user text never goes raw inside a ``{hash
tag}`` (a ``}`` or an empty string would move the key to another Cluster slot).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
from typing import Any

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from .conf import get_config

_TAG_FORBIDDEN = frozenset("{}")
_SEPARATOR = ":"


@functools.cache
def _secret() -> bytes:
    # A key derived from SECRET_KEY for this purpose only, so the hashes we publish in
    # key names reveal nothing usable against Django's own signing.
    return hashlib.sha256(b"django_redispatterns.keys\0" + settings.SECRET_KEY.encode()).digest()


def reset_secret() -> None:
    _secret.cache_clear()


@receiver(setting_changed, dispatch_uid="django_redispatterns.keys.reset_secret")
def _settings_changed(*, setting: str, **kwargs: Any) -> None:
    if setting == "SECRET_KEY":
        reset_secret()


def identity_hash(value: str | bytes, *, purpose: str = "") -> str:
    """A keyed, stable, non-reversible 32-hex-digit digest of ``value``.

    ``purpose`` separates domains: the same IP hashed for rate limiting and for sessions
    gives different digests. Rotating ``SECRET_KEY`` changes every digest (counters and
    indexes keyed by them start afresh).
    """
    data = value.encode() if isinstance(value, str) else value
    mac = hmac.new(_secret(), purpose.encode() + b"\0" + data, hashlib.sha256)
    return mac.hexdigest()[:32]


def hash_tag(value: str) -> str:
    """``{value}`` for a value we control (a namespace or a digest), validated."""
    if not value or _TAG_FORBIDDEN.intersection(value):
        raise ValueError(
            f"hash tag content must be non-empty and brace-free, got {value!r}; "
            "hash user text with identity_hash() first"
        )
    return "{" + value + "}"


def prefix() -> str:
    """The configured ``KEY_PREFIX``."""
    return get_config().key_prefix


def make_key(feature: str, *parts: str, tag: str | None = None) -> str:
    """``<prefix>:<feature>[:{tag}]:<part>:...`` — the one format of every key we write.

    Keys that a single Lua script touches together must pass the same ``tag``.
    """
    pieces = [prefix(), feature]
    if tag is not None:
        pieces.append(hash_tag(tag))
    pieces.extend(parts)
    return _SEPARATOR.join(pieces)


def feature_pattern(feature: str) -> str:
    """A SCAN ``MATCH`` pattern covering every key of ``feature``."""
    return f"{glob_escape(prefix())}{_SEPARATOR}{glob_escape(feature)}{_SEPARATOR}*"


def glob_escape(text: str) -> str:
    """``text`` matched literally inside a SCAN ``MATCH`` pattern (``*?[]\\`` escaped)."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)
