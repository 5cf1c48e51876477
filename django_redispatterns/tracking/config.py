"""The settings of a local store kept by tracking: the cache's ``OPTIONS["NEAR_CACHE"]``
and ``REDIS_PATTERNS["SESSIONS"]["NEAR_CACHE"]``, validated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError

_KNOWN = ("MAX_ENTRIES", "MAX_BYTES", "PREFIXES", "MAX_LOCAL_TTL")
CACHE_SETTING = "CACHES OPTIONS['NEAR_CACHE']"


@dataclass(frozen=True)
class NearConfig:
    """One local store's settings, validated."""

    max_entries: int
    max_bytes: int
    prefixes: tuple[str, ...] | None  # None: every key
    max_local_ttl: float | None  # seconds; None: only the key's TTL in Redis bounds it

    def wants(self, key: Any) -> bool:
        """True when ``key`` (the caller's key, before KEY_PREFIX and version) is kept
        locally."""
        return self.prefixes is None or (isinstance(key, str) and key.startswith(self.prefixes))


def read_config(value: Any, name: str = CACHE_SETTING,
                known: tuple[str, ...] = _KNOWN) -> NearConfig | None:
    """The setting ``name`` (keys ``known``) as a :class:`NearConfig` (``None``: off).

    Raises :class:`ConfigurationError` naming the setting for a wrong type or range."""
    if value is None or value is False:
        return None
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{name} must be a dict (or None to turn it off), got {value!r}.")
    unknown = sorted(set(value) - set(known))
    if unknown:
        raise ConfigurationError(f"{name} has unknown keys {unknown}; known: {list(known)}.")
    prefixes = value.get("PREFIXES")
    if prefixes is not None:
        if (isinstance(prefixes, str) or not isinstance(prefixes, (list, tuple))
                or not prefixes or not all(isinstance(p, str) and p for p in prefixes)):
            raise ConfigurationError(
                f"{name}['PREFIXES'] must be a non-empty list of non-empty strings, "
                f"got {prefixes!r}.")
        prefixes = tuple(prefixes)
    ttl = value.get("MAX_LOCAL_TTL")
    if ttl is not None and (isinstance(ttl, bool) or not isinstance(ttl, (int, float))
                            or not ttl > 0):
        raise ConfigurationError(
            f"{name}['MAX_LOCAL_TTL'] must be a number of seconds > 0 (or None), got {ttl!r}.")
    return NearConfig(
        max_entries=_positive_int(value, "MAX_ENTRIES", 10_000, name),
        max_bytes=_positive_int(value, "MAX_BYTES", 64 * 1024 * 1024, name),
        prefixes=prefixes,
        max_local_ttl=None if ttl is None else float(ttl),
    )


def _positive_int(value: dict[str, Any], key: str, default: int, name: str) -> int:
    found = value.get(key, default)
    if isinstance(found, bool) or not isinstance(found, int) or found < 1:
        raise ConfigurationError(f"{name}[{key!r}] must be an int >= 1, got {found!r}.")
    return found
