"""A bounded in-process store of values read from Redis, and the bookkeeping that keeps
an invalidation from being overtaken by a read still in flight.

:class:`LocalStore` holds raw Redis values with a local deadline. Every invalidation takes
the next number of a sequence, a read captures the sequence (its *ticket*) before it asks
Redis, and :meth:`LocalStore.put` refuses the value when the key was invalidated after that
ticket. The per-key marks are bounded too: when the oldest are dropped, reads holding a
ticket older than what was dropped are refused as a whole (a rare extra miss, never a stale
entry).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

#: Bytes counted for each entry on top of its key and value (dict slot, tuple, floats).
ENTRY_OVERHEAD = 120
#: Invalidation marks kept per store (see the module docstring).
MAX_MARKS = 8192

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
