"""Lock names -> key names, argument checks, and acquisition tokens."""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import re
import secrets
from collections.abc import Sequence
from typing import Any

from .. import keys
from ..conf import get_config

DEFAULT_NAMESPACE = "locks"
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9_.\-/]{1,100}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]{1,50}")


# --- keys -------------------------------------------------------------------------------


def name_part(name: str) -> str:
    """The key segment for a lock name: the name itself when short and plain, else a digest.

    The digest is a plain SHA-256 (not keyed by SECRET_KEY): a key that changed when the
    secret is rotated would let an old and a new host hold "the same" lock at once.
    """
    if _SIMPLE_NAME.fullmatch(name):
        return name
    return "#" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def held_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The key holding the lease of ``name`` (token, fencing token, owner metadata)."""
    return lock_keys(keys.prefix(), namespace, name)[0]


def fence_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The fencing counter of ``name``."""
    return lock_keys(keys.prefix(), namespace, name)[1]


def wake_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The wake-up list of ``name``: a release pushes onto it, waiters block on it."""
    return lock_keys(keys.prefix(), namespace, name)[3]


def waiting_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The "someone waits" marker of ``name``, set by a waiter's failed attempt."""
    return lock_keys(keys.prefix(), namespace, name)[2]


@functools.lru_cache(maxsize=4096)
def lock_keys(prefix: str, namespace: str, name: str) -> tuple[str, str, str, str]:
    """(held, fence, waiting, wake) keys of one name; all share the namespace's hash tag."""
    # Keyed on the prefix too, so a settings change (override_settings) is honoured.
    part = name_part(name)
    return (keys.make_key("lock", "held", part, tag=namespace),
            keys.make_key("lock", "fence", part, tag=namespace),
            keys.make_key("lock", "waiting", part, tag=namespace),
            keys.make_key("lock", "wake", part, tag=namespace))


def connection_names(quorum: Sequence[Any], connection: str | None = None) -> list[str]:
    """Where locks live: every quorum member, else ``connection`` or the LOCKS connection."""
    if quorum:
        return [str(c) for c in quorum]
    return [connection or get_config().connection_for("LOCKS")]


# --- argument checks --------------------------------------------------------------------


def check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a lock name must be a non-empty str, got {name!r}")
    return name


def check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"a lock namespace must be 1-50 characters of A-Z a-z 0-9 _ . -, got {namespace!r}"
        )
    return namespace


def check_seconds(what: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


# --- tokens ---------------------------------------------------------------------------
# A token is unique per acquisition: 128 random bits drawn once per process (again after a
# fork) followed by a counter. Reading os.urandom for every acquisition cost as much as a
# third of a Redis round trip; uniqueness, not secrecy, is what the owner check needs.

_token_prefix = secrets.token_hex(16)
_token_counter = itertools.count(1)


def _reseed_tokens() -> None:
    global _token_prefix, _token_counter
    _token_prefix = secrets.token_hex(16)
    _token_counter = itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_tokens)


def new_token() -> str:
    """A token never issued before by any process (32 random hex digits + a counter)."""
    return f"{_token_prefix}{next(_token_counter):x}"
