"""Atomic counters that keep their TTL: ``incr``/``decr`` sync and async.

One ``lua/cache_incr.lua`` call (``EXISTS`` + ``INCRBY``, the TTL set only when the call
creates the counter). Beyond 64 bits, where ``INCRBY`` refuses, an optimistic
``WATCH``/``MULTI`` update of the decoded value: still atomic, still keeping the TTL.
Both answer ``None`` for a missing key that had to exist, and raise
:class:`~django_redispatterns.exceptions.NotAnIntegerError` for a value that is no integer.
"""

from __future__ import annotations

from typing import Any

import redis
from redis.exceptions import ResponseError, WatchError

from ..connection import is_cluster
from ..exceptions import NotAnIntegerError
from ..scripts import script
from .codec import Codec


class Counters:
    """``ttl_ms`` gives the TTL (ms) of a counter a call creates (0: none)."""

    def __init__(self, codec: Codec, ttl_ms: Any) -> None:
        self._codec = codec
        self._ttl_ms = ttl_ms

    def _args(self, delta: int, must_exist: bool) -> list[Any]:
        return [delta, "1" if must_exist else "0", self._ttl_ms()]

    def incr(self, conn: Any, nkey: str, delta: int, *, must_exist: bool) -> Any:
        try:
            return script("cache_incr")(conn, [nkey], self._args(delta, must_exist))
        except ResponseError:
            return self._incr_big(conn, nkey, delta)

    async def aincr(self, aclient: Any, nkey: str, delta: int) -> Any:
        try:
            return await script("cache_incr").acall(aclient, [nkey], self._args(delta, True))
        except ResponseError:
            return await self._aincr_big(aclient, nkey, delta)

    def _incr_big(self, conn: Any, nkey: str, delta: int) -> Any:
        if redis.VERSION < (6,) and is_cluster(conn):  # its Cluster pipelines have no WATCH
            conn = conn.get_redis_connection(conn.get_node_from_key(nkey))  # the key's node
        # transaction=True: a Cluster pipeline only allows WATCH in a transaction
        with conn.pipeline(transaction=True) as pipe:
            while True:
                try:
                    pipe.watch(nkey)
                    raw = pipe.get(nkey)
                    if raw is None:
                        return None
                    value = _integer(self._codec.value(raw), nkey) + delta
                    pipe.multi()
                    pipe.set(nkey, self._codec.encode_plain(value), keepttl=True)
                    pipe.execute()
                    return value
                except WatchError:
                    continue

    async def _aincr_big(self, aclient: Any, nkey: str, delta: int) -> Any:
        async with aclient.pipeline() as pipe:
            while True:
                try:
                    await pipe.watch(nkey)
                    raw = await pipe.get(nkey)
                    if raw is None:
                        return None
                    value = _integer(self._codec.value(raw), nkey) + delta
                    pipe.multi()
                    pipe.set(nkey, self._codec.encode_plain(value), keepttl=True)
                    await pipe.execute()
                    return value
                except WatchError:
                    continue


def _integer(value: Any, nkey: str) -> int:
    if type(value) is not int:  # bool is no counter either
        raise NotAnIntegerError(
            f"Cannot increment cache key {nkey!r}: its value is a {type(value).__name__}, "
            "not an integer.")
    return value
