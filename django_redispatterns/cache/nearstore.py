"""The near cache's settings and its in-process store (an LRU bounded by entries and bytes).

:class:`LocalStore` holds raw Redis values (what GET returned) with a local deadline. It
also keeps the bookkeeping that stops a read from storing a value an invalidation has
already overtaken: every invalidation takes the next number of a sequence, a fill
captures the sequence (its *ticket*) before it asks Redis, and :meth:`LocalStore.put`
refuses the value when the key was invalidated after that ticket. The per-key marks are
bounded too: when the oldest are dropped, fills holding a ticket older than what was
dropped are refused as a whole (a rare extra miss, never a stale entry).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from ..exceptions import ConfigurationError

#: Bytes counted for each entry on top of its key and value (dict slot, tuple, floats).
ENTRY_OVERHEAD = 120
#: Invalidation marks kept per store (see the module docstring).
MAX_MARKS = 8192

_KNOWN = ("MAX_ENTRIES", "MAX_BYTES", "PREFIXES", "MAX_LOCAL_TTL")


@dataclass(frozen=True)
class NearConfig:
    """``OPTIONS["NEAR_CACHE"]`` of one cache, validated."""

    max_entries: int
    max_bytes: int
    prefixes: tuple[str, ...] | None  # None: every key
    max_local_ttl: float | None  # seconds; None: only the key's TTL in Redis bounds it

    def wants(self, key: Any) -> bool:
        """True when ``key`` (the caller's key, before KEY_PREFIX and version) is kept
        locally."""
        return self.prefixes is None or (isinstance(key, str) and key.startswith(self.prefixes))


def read_config(value: Any) -> NearConfig | None:
    """``OPTIONS["NEAR_CACHE"]`` as a :class:`NearConfig` (``None``: the near cache is off).

    Raises :class:`ConfigurationError` naming the setting for a wrong type or range."""
    if value is None or value is False:
        return None
    name = "CACHES OPTIONS['NEAR_CACHE']"
    if value is True:
        value = {}
    if not isinstance(value, dict):
        raise ConfigurationError(f"{name} must be a dict (or None to turn it off), got {value!r}.")
    unknown = sorted(set(value) - set(_KNOWN))
    if unknown:
        raise ConfigurationError(f"{name} has unknown keys {unknown}; known: {list(_KNOWN)}.")
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


Entry = tuple[bytes, float, Any, int]  # (raw value, deadline, decode hint, bytes counted)


class LocalStore:
    """Thread-safe LRU of ``nkey -> (raw, deadline, hint)``: ``deadline`` in
    ``time.monotonic()`` seconds, ``hint`` what the caller keeps to decode ``raw`` fast.
    It never holds more than ``max_entries`` entries or ``max_bytes`` bytes (keys, values
    hints that are bytes of their own, and :data:`ENTRY_OVERHEAD` each)."""

    def __init__(self, max_entries: int, max_bytes: int) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._data: OrderedDict[str, Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self._seq = 0  # number of the latest invalidation
        self._marks: dict[str, int] = {}  # key -> number of its latest invalidation
        self._floor = 0  # fills with a ticket below this are refused (marks dropped)

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, nkey: object) -> bool:
        return nkey in self._data

    @property
    def nbytes(self) -> int:
        return self._bytes

    def get(self, nkey: str, now: float) -> Entry | None:
        """A live entry (now marked recently used), else ``None``."""
        with self._lock:
            entry = self._data.get(nkey)
            if entry is None:
                return None
            if entry[1] <= now:
                self._drop(nkey)
                return None
            self._data.move_to_end(nkey)
            return entry

    def ticket(self) -> int:
        """Capture before asking Redis; hand to :meth:`put` with what Redis answered."""
        return self._seq

    def put(self, nkey: str, raw: bytes, deadline: float, ticket: int, hint: Any = None) -> bool:
        """Store ``raw`` unless ``nkey`` was invalidated (or the store cleared) since
        ``ticket`` was taken, or it alone exceeds ``max_bytes``. True when stored."""
        size = len(nkey) + len(raw) + ENTRY_OVERHEAD
        if isinstance(hint, bytes) and hint is not raw:
            size += len(hint)
        with self._lock:
            if ticket < self._floor or self._marks.get(nkey, -1) > ticket:
                return False
            if size > self.max_bytes:
                return False
            if nkey in self._data:
                self._drop(nkey)
            self._data[nkey] = (raw, deadline, hint, size)
            self._bytes += size
            while len(self._data) > self.max_entries or self._bytes > self.max_bytes:
                self._drop(next(iter(self._data)))
            return True

    def invalidate(self, nkeys: list[str]) -> None:
        """Drop ``nkeys``' entries and refuse fills of them that started before now."""
        with self._lock:
            for nkey in nkeys:
                self._seq += 1
                self._marks.pop(nkey, None)
                self._marks[nkey] = self._seq
                if nkey in self._data:
                    self._drop(nkey)
            while len(self._marks) > MAX_MARKS:
                oldest = next(iter(self._marks))
                self._floor = max(self._floor, self._marks.pop(oldest))

    def clear(self) -> None:
        """Drop every entry and refuse every fill that started before now."""
        with self._lock:
            self._seq += 1
            self._floor = self._seq
            self._marks.clear()
            self._data.clear()
            self._bytes = 0

    def _drop(self, nkey: str) -> None:
        self._bytes -= self._data.pop(nkey)[3]
