"""The near cache: hot keys served from process memory, kept correct by Redis tracking.

Opt-in with ``OPTIONS["NEAR_CACHE"]`` (docs/cache.md, "Near cache"). A miss reads the key
on a connection of the near cache's own pool, which has ``CLIENT TRACKING on REDIRECT``
to the process's invalidation channel (:mod:`..tracking.listener`), with one script that returns
the value and its PTTL (``lua/cache_near_get.lua``): one round trip, and the local copy
never outlives the key in Redis. The value is stored (:mod:`..tracking.store`) only when

* the channel is healthy and was the same one (epoch) before the read and after it, and
  the read connection had tracking on for that epoch;
* no invalidation of the key (and no clear of the store) happened since the read began;
* it is not a ``get_or_set`` value already past its soft expiry (its deadline is capped
  at the soft expiry as well, so a stale value is never served from memory).

Redis forgets what a connection tracked once it closes, so every local entry is tied to
the fill connection that read it and dropped when that connection closes or is found
closed (:mod:`..tracking.fills`). ``aget`` fills through the same synchronous pool, in a worker
thread: no per-event-loop pools, so event loops that come and go (``asyncio.run`` per
call, ``async_to_sync``) leave no connections behind.

Single-server, Sentinel and Redis Cluster locations with django-redis's ``DefaultClient``
are supported (the near cache's own connections speak RESP2). On Cluster each primary has
its own channel and fill pool (:mod:`..tracking.cluster`); a fill answered ``MOVED`` or ``ASK``
empties the local store and reads the key through the cache's own client, unkept.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

from django_redis.compressors.identity import IdentityCompressor
from django_redis.exceptions import CompressorError
from redis.exceptions import NoScriptError

from ..scripts import script
from ..tracking.cluster import ClusterChannels
from ..tracking.config import NearConfig
from ..tracking.fills import FillKeys
from ..tracking.listener import Listener
from ..tracking.reader import TrackedReads
from ..tracking.reads import Read
from ..tracking.store import Entry
from . import envelope, meta

# Django builds one backend per thread and alias: they share one near cache per process
# and configuration (same LOCATION and OPTIONS), so a write by one thread drops the
# local copy every thread reads, and there is one channel, not one per thread.
Fetched = tuple[bytes, Any, Any]  # (raw, decode hint, get_or_set metadata or None)
_shared: dict[tuple[str, str], NearCache] = {}
_shared_lock = threading.Lock()


def shared(owner: Any, config: NearConfig, server: Any, options: dict[str, Any]) -> NearCache:
    """The process's near cache for ``server`` with ``options`` (created on first use)."""
    key = (repr(server), repr(sorted(options.items(), key=lambda item: str(item[0]))))
    with _shared_lock:
        near = _shared.get(key)
        if near is None:
            near = _shared[key] = NearCache(owner, config, repr(server))
            near._key = key
        return near


class NearCache:
    """One cache's near cache in this process. ``owner`` is the backend (``.client`` is
    its django-redis client, read lazily)."""

    def __init__(self, owner: Any, config: NearConfig, name: str) -> None:
        self._owner = owner
        self.config = config
        self.wants = config.wants
        self.reads = TrackedReads(lambda: owner.client.get_client(write=True),
                                  config.max_entries, config.max_bytes,
                                  "CACHES OPTIONS['NEAR_CACHE']", name)
        self.store = self.reads.store
        self._script = script("cache_near_get")
        self._loads: Callable[[bytes], Any] = lambda payload: None
        self._key: tuple[str, str] | None = None

    @property
    def listener(self) -> Listener | ClusterChannels | None:
        return self.reads.listener

    @property
    def fills(self) -> FillKeys:
        return self.reads.fills

    @property
    def _pool(self) -> Any:
        return self.reads.pool

    # --- the hit path -----------------------------------------------------------------

    def lookup(self, nkey: str) -> Entry | None:
        """The entry held locally for ``nkey`` (``decode(entry[2])`` is its value), or ``None``
        (then call :meth:`fetch`)."""
        return self.reads.lookup(nkey)

    def decode(self, hint: Any) -> Any:
        """The value behind a decode hint, as ``get`` returns it: a fresh copy of a mutable
        value (deserialized on each hit, like any cache read), an int as is."""
        if hint.__class__ is tuple:
            return hint[0]
        return self._loads(hint)

    # --- a miss -----------------------------------------------------------------------

    def fetch(self, nkey: str) -> Fetched | None:
        """GET ``nkey`` from Redis (one round trip), keeping it locally when that is safe
        (module docstring): ``(raw, decode hint, get_or_set metadata or None)``, or
        ``None`` when there is no such key.
        Redis errors propagate."""
        if self.reads.listener is None:
            self._start()
        read = self.reads.read(nkey, lambda conn: self._eval(conn, nkey))
        return self._unkept(nkey) if read is None else self._keep(nkey, read)

    def _unkept(self, nkey: str) -> Fetched | None:
        """``nkey`` read through the cache's own client (it follows MOVED / ASK), not kept."""
        # Two GETs, not one MGET: during a slot migration the two keys may sit on two
        # nodes for a moment, and a multi-key read is refused until they meet again.
        client = self._owner.client.get_client(write=True)
        raw = client.get(nkey)
        return None if raw is None else (raw, _hint(raw), client.get(self._meta_key(nkey)))

    async def afetch(self, nkey: str) -> Fetched | None:
        """:meth:`fetch` in a worker thread (one pool for sync and async callers)."""
        return await asyncio.to_thread(self.fetch, nkey)

    def _keep(self, nkey: str, read: Read) -> Fetched | None:
        """A fill's answer: stored locally when that is safe (module docstring)."""
        reply = read.reply
        if not reply:
            return None
        raw, pttl = reply[0], int(reply[1])
        record = reply[2] if len(reply) > 2 else None
        hint = _hint(raw)
        if read.keepable():
            deadline = self._deadline(raw, read.deadline(pttl, self.config.max_local_ttl),
                                      record)
            if deadline is not None:
                self.store.put(nkey, raw, deadline, read.ticket, hint)
        return raw, hint, record

    @staticmethod
    def _deadline(raw: bytes, deadline: float, record: Any = None) -> float | None:
        """When the local copy of ``raw`` must be dropped (``time.monotonic()``): its
        TTL ``deadline``, or earlier the soft expiry in ``record`` (the value's
        ``get_or_set`` metadata) or in an envelope; ``None`` when it must not be stored."""
        found = envelope.times(raw) if envelope.is_envelope(raw) else meta.times(record, raw)
        if found is not None:  # its soft expiry is wall-clock time
            deadline = min(deadline, time.monotonic() + found[0] - time.time())
        return None if deadline <= time.monotonic() else deadline

    def _eval(self, conn: Any, nkey: str) -> Any:
        try:
            conn.send_command("EVALSHA", self._script.sha, 2, nkey, self._meta_key(nkey))
            return conn.read_response()
        except NoScriptError:
            conn.send_command("EVAL", self._script.source, 2, nkey, self._meta_key(nkey))
            return conn.read_response()

    def _meta_key(self, nkey: str) -> str:
        return str(self._owner._codec.meta_key(nkey))

    def _loader(self) -> Callable[[bytes], Any]:
        """django-redis's decode without its int probe (the hint made it already)."""
        client = self._owner.client
        compressor, loads = client._compressor, client._serializer.loads
        if type(compressor) is IdentityCompressor:
            return loads

        def decompress_and_load(payload: bytes) -> Any:
            with contextlib.suppress(CompressorError):  # small values are left as they are
                payload = compressor.decompress(payload)
            return loads(payload)

        return decompress_and_load

    # --- writes of this process -------------------------------------------------------

    def _start(self) -> Listener | ClusterChannels:
        """Start the channel (and the decoder) now rather than on the first miss."""
        self._loads = self._loader()
        return self.reads._start()

    def forget(self, nkeys: list[str]) -> None:
        """This process wrote ``nkeys``: drop their entries and any fill in flight."""
        self.reads.forget(nkeys)

    def forget_all(self) -> None:
        self.reads.forget_all()

    def stop(self) -> None:
        """Stop the channel's thread and close the near cache's connections; the next
        backend built for this configuration starts a new near cache."""
        with _shared_lock:
            if self._key is not None and _shared.get(self._key) is self:
                del _shared[self._key]
        self.reads.stop()


def _hint(raw: bytes) -> Any:
    """How a hit decodes ``raw``: ``(int,)`` for django-redis's plain ints (immutable,
    returned as is), else the serialized payload (an envelope's without its header)."""
    if envelope.is_envelope(raw):
        return raw[envelope.HEADER_LEN:]
    first = raw[:1]
    if first and (first in b"+-0123456789" or first.isspace()):  # what int() may accept
        with contextlib.suppress(ValueError):
            return (int(raw),)
    return raw
