"""The per-user index on the Redis side: list, read, prune and revoke a user's sessions.

A user's index is a sorted set ``sid -> expiry`` under the user's hash tag (see
:mod:`.keyspace`), kept exact by the ``session_save`` / ``session_delete`` scripts. The
functions here do bounded work per call: at most ``MAX_PER_USER`` members read, one pipeline
per batch, one Lua call per revoke batch. They raise Redis errors as they come; :mod:`.api`
turns an unreachable Redis into ``SessionStoreUnavailable``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from .. import scripts
from . import memory
from .keyspace import data_key, index_key, text

REVOKE_BATCH = 500
LIST_BATCH = 500


class StoredSession(NamedTuple):
    """One live session as the index reads it: raw metadata, remaining TTL in ms."""

    sid: str
    created: Any
    activity: Any
    ip: str
    user_agent: str
    pttl: int


def live_sessions(client: Any, tag: str, limit: int) -> Iterator[StoredSession]:
    """The live sessions in ``tag``'s index, at most ``limit``, the latest-expiring first.

    Reads at most ``limit`` members (one ``ZREVRANGE``), then one pipeline per batch of
    :data:`LIST_BATCH`; members whose session is gone (expired, deleted, evicted) are pruned.
    """
    members = [text(m) for m in client.zrevrange(index_key(tag), 0, max(0, limit - 1))]
    for start in range(0, len(members), LIST_BATCH):
        batch = members[start:start + LIST_BATCH]
        pipe = client.pipeline(transaction=False)
        for sid in batch:
            pipe.hmget(data_key(tag, sid), ["c", "a", "ip", "ua", "d"])
            pipe.pttl(data_key(tag, sid))
        replies = pipe.execute()
        dead = []
        for i, sid in enumerate(batch):
            created, activity, ip, ua, data = replies[2 * i]
            pttl = replies[2 * i + 1]
            if data is None or pttl is None or pttl < 0:
                dead.append(sid)
                continue
            yield StoredSession(sid, created, activity, text(ip) if ip is not None else "",
                                text(ua) if ua is not None else "", int(pttl))
        if dead:
            client.zrem(index_key(tag), *dead)


def revoke_all(client: Any, tag: str, keep_sid: str) -> int:
    """Delete every session in ``tag``'s index but ``keep_sid``; how many were deleted.

    Batches of :data:`REVOKE_BATCH` (one Lua call each), so Redis is never blocked long.
    """
    revoke = scripts.script("session_revoke")
    deleted = 0
    batch: list[str] = []
    while True:
        result = revoke(client, [index_key(tag), *(data_key(tag, sid) for sid in batch)],
                        [keep_sid, REVOKE_BATCH, *batch])
        deleted += int(result[0])
        memory.forget_all()  # this process's copies go before the call returns
        batch = [text(sid) for sid in result[1]]
        if not batch:
            return deleted


def revoke_one(client: Any, tag: str, sid: str) -> bool:
    """Delete one session of ``tag``'s index (and its member); False if it was not there."""
    try:
        return bool(scripts.script("session_delete")(
            client, [data_key(tag, sid), index_key(tag)], [sid, ""]))
    finally:
        memory.forget([data_key(tag, sid)])
