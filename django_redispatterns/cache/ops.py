"""The Redis commands the cache sends itself, on django-redis's sync clients.

Everything else (``set``, ``add``, ``delete``, ``ttl``...) goes through django-redis's own
client class untouched. :class:`RedisOps` picks the server for a key (the primary, a
replica for reads, the shard of a sharded client) and runs the single-flight flow's
operations (:mod:`.stampede`), the jittered ``set_many`` pipeline and the keyspace walk
of ``clear()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

from ..connection import is_cluster
from ..scripts import script

CLEAR_BATCH = 500  # keys per UNLINK


class Owner(Protocol):
    client: Any  # the backend's django-redis client (built lazily; read at each call)


class RedisOps:
    """Server routing and the flow's commands for one backend."""

    def __init__(self, owner: Owner, *, shard: bool) -> None:
        self._owner = owner
        self.shard = shard

    def primary(self, nkey: str) -> Any:
        if self.shard:
            return self._owner.client.get_server(nkey)
        return self._owner.client.get_client(write=True)

    def reader(self, nkey: str) -> Any:
        if self.shard:
            return self._owner.client.get_server(nkey)
        return self._owner.client.get_client(write=False)

    def on_cluster(self, nkey: str) -> bool:
        return is_cluster(self.primary(nkey))

    def every_primary(self) -> list[Any]:
        if self.shard:
            return list(self._owner.client._serverdict.values())
        return [self._owner.client.get_client(write=True)]

    def set_each(self, data: dict[Any, Any], ttl: Callable[[], float | None],
                 version: int | None) -> None:
        """``set_many`` with a timeout of its own for each key (``ttl()``), one pipeline."""
        client = self._owner.client
        pipe = client.get_client(write=True).pipeline()
        for key, value in data.items():
            client.set(key, value, ttl(), version=version, client=pipe)
        pipe.execute()

    def run(self, op: tuple[Any, ...]) -> Any:
        """One Redis operation the single-flight flow yielded (claim, wait, renew, settle)."""
        kind = op[0]
        if kind == "wait":
            conn = self.primary(op[1])
            return conn.blmove(op[1], op[1], op[2], "RIGHT", "LEFT") is not None
        keys, args = op[1], op[2]
        return script(f"cache_{kind}")(self.primary(keys[0]), keys, args)

    def unlink_matching(self, pattern: str) -> None:
        """SCAN every primary for ``pattern`` and UNLINK what matches, in batches."""
        for conn in self.every_primary():
            _unlink_all(conn, conn.scan_iter(match=pattern, count=1000))


def _unlink_all(conn: Any, nkeys: Iterable[bytes]) -> None:
    batch: list[bytes] = []
    for nkey in nkeys:
        batch.append(nkey)
        if len(batch) >= CLEAR_BATCH:
            conn.unlink(*batch)
            batch.clear()
    if batch:
        conn.unlink(*batch)
