"""Session loads served from process memory, kept correct by Redis tracking (opt-in).

With ``REDIS_PATTERNS["SESSIONS"]["NEAR_CACHE"]`` on, each process keeps the session
records it loaded (the signed data, its format and last activity: what ``load()`` reads)
and answers the next load of the same session from memory. A record is filled on a
connection with ``CLIENT TRACKING`` redirected to the process's invalidation channel, in
one round trip (``HMGET`` and ``PTTL``, pipelined), so that

* any change of the record anywhere — a save, an activity write, ``logout_everywhere``,
  ``end_session``, expiry, eviction, ``FLUSHDB`` — drops the copy in every process as soon
  as the channel delivers Redis's message (well under a millisecond on one host);
* a copy is served only while the channel is healthy: it answers a numbered ``PING``
  every :data:`PING_EVERY` seconds, and once the newest answered one was sent
  :data:`SILENT_LIMIT` seconds ago (connection lost, server hung or restarted, failover,
  a channel behind a burst) loads go to Redis again and the copies are dropped. So a
  revocation is visible to every process within :data:`SILENT_LIMIT` seconds at worst;
* a copy never outlives the record's TTL in Redis (nor ``MAX_LOCAL_TTL``, if set), and
  this process's own writes drop its copy before they return (read-your-writes);
* a connection that closes takes its copies with it (Redis forgets what it tracked).

Only records that exist are kept: a cookie of no session asks Redis each time.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

from ..conf import get_config
from ..tracking.config import NearConfig, read_config
from ..tracking.reader import TrackedReads
from ..tracking.reads import Read
from .keyspace import client

SETTING = "REDIS_PATTERNS['SESSIONS']['NEAR_CACHE']"
_KNOWN = ("MAX_ENTRIES", "MAX_BYTES", "MAX_LOCAL_TTL")
FIELDS = ("d", "v", "a")  # data, format version, last activity: what load() needs
PING_EVERY = 0.1  # seconds between the channel's numbered PINGs
SILENT_LIMIT = 0.5  # seconds: the worst case for a revocation to reach every process

Record = tuple[Any, Any, Any]  # HMGET d v a


class SessionMemory:
    """The process's copies of session records for one Redis client (``base``)."""

    def __init__(self, base: Any, config: NearConfig) -> None:
        self.base = base
        self.config = config
        self.reads = TrackedReads(lambda: base, config.max_entries, config.max_bytes, SETTING,
                                  f"sessions {_server_name(base)}",
                                  ping_every=PING_EVERY, silent_limit=SILENT_LIMIT)

    def record(self, hash_key: str) -> Record:
        """``HMGET hash_key d v a``: from memory when held (and safe), else from Redis,
        kept when that is safe. Redis errors propagate."""
        entry = self.reads.lookup(hash_key)
        if entry is not None:
            return entry[2]
        read = self.reads.read(hash_key, lambda conn: _hmget_pttl(conn, hash_key))
        if read is None:  # no channel covers the key now (a Cluster slot moving)
            return tuple(self.base.hmget(hash_key, FIELDS))
        return self._keep(hash_key, read)

    async def arecord(self, hash_key: str) -> Record:
        """:meth:`record`, filling in a worker thread (one pool for sync and async)."""
        entry = self.reads.lookup(hash_key)
        if entry is not None:
            return entry[2]
        return await asyncio.to_thread(self.record, hash_key)

    def _keep(self, hash_key: str, read: Read) -> Record:
        fields, pttl = read.reply
        record: Record = tuple(fields)
        raw, pttl = record[0], int(pttl)
        if raw is None or pttl == -2 or not read.keepable():
            return record
        deadline = read.deadline(pttl, self.config.max_local_ttl)
        self.reads.store.put(hash_key, raw, deadline, read.ticket, record)
        return record

    def forget(self, hash_keys: list[str]) -> None:
        """This process wrote these records: drop the copies (and any fill in flight)."""
        self.reads.forget(hash_keys)

    def forget_all(self) -> None:
        """This process wrote records it cannot name (a user's sessions): drop every copy."""
        self.reads.forget_all()

    def stop(self) -> None:
        self.reads.stop()


def _server_name(base: Any) -> str:
    """``host:port/db`` of a single-server client (Sentinel, Cluster: the client's kind)."""
    kwargs = getattr(getattr(base, "connection_pool", None), "connection_kwargs", None) or {}
    if "host" in kwargs:
        return f"{kwargs['host']}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"
    return type(base).__name__


def _hmget_pttl(conn: Any, hash_key: str) -> tuple[Any, Any]:
    """One round trip: the record's fields and its remaining TTL (ms)."""
    conn.send_packed_command(conn.pack_commands([("HMGET", hash_key, *FIELDS),
                                                 ("PTTL", hash_key)]))
    fields = conn.read_response()  # an error reply raises: the connection is then closed
    return fields, conn.read_response()


_current: SessionMemory | None = None
_built_for: Any = None  # the settings object _current was made for
_current_lock = threading.Lock()


def memory() -> SessionMemory | None:
    """The process's session memory for the current settings, or ``None`` (off: the
    default). Raises ``ConfigurationError`` naming the setting when it is malformed."""
    config = get_config()
    current = _current
    if _built_for is config and (current is None or current.base is client()):
        return current
    return _rebuild(config)


def read_settings(config: Any) -> NearConfig | None:
    """The validated ``NEAR_CACHE`` of ``config``'s sessions (``None``: off)."""
    return read_config(config.feature("SESSIONS")["NEAR_CACHE"], SETTING, _KNOWN)


def _rebuild(config: Any) -> SessionMemory | None:
    """Settings or clients changed: a new session memory (or none), the old one stopped."""
    global _current, _built_for
    wanted = read_settings(config)
    with _current_lock:
        old = _current
        fresh = None
        if wanted is not None:
            base = client()
            same = old is not None and old.base is base and old.config == wanted
            fresh = old if same else SessionMemory(base, wanted)
        _current, _built_for = fresh, config
    if old is not None and old is not fresh:
        old.stop()
    return fresh


def stop() -> None:
    """Stop the process's session memory (its thread and connections); the next load
    starts it again if the settings still turn it on."""
    global _current, _built_for
    with _current_lock:
        old, _current, _built_for = _current, None, None
    if old is not None:
        old.stop()


def forget(hash_keys: list[str]) -> None:
    """This process wrote these session records (no-op when the memory is off)."""
    current = _current
    if current is not None:
        current.forget(hash_keys)


def forget_all() -> None:
    """This process wrote session records it cannot name (no-op when the memory is off)."""
    current = _current
    if current is not None:
        current.forget_all()
