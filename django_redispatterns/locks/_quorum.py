"""Quorum mode (Redlock): the lease of one lock on N independent masters.

A name is held when a majority took it within the lease minus the clock drift allowance;
the fencing token is the highest of that majority, written back to every master so the
next majority (which overlaps this one in at least one master) issues a higher one.
Waiters in quorum mode use the jittered back-off only (no cross-process wake-up list:
a release on a minority of masters could not promise one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any

import redis

from .. import scripts
from ._lease import FENCE_FLOOR, Attempt, Server, parse_acquire

logger = logging.getLogger("django_redispatterns.locks")

DRIFT_FACTOR = 0.01  # clock drift allowance, 1 % of the TTL + 2 ms


class Quorum(Server):
    """The lease of one lock on a majority of independent masters."""

    quorum_mode = True
    wakes_waiters = False  # waiters back off (see the module docstring)

    def attempt(self, token: str, keys_: list[str], args: list[Any], ttl: float) -> Attempt:
        clients = self.clients()
        lua = scripts.script(self.target.acquire_script)
        started = time.monotonic()
        replies: list[Any] = []
        for client in clients:  # sequential: each call is one short round trip
            try:
                replies.append(lua(client, keys_, args))
            except redis.RedisError as exc:
                self._member_down(exc)
                replies.append(None)
        self._require_quorum(token, replies)
        attempt = self._decide(replies, started, ttl)
        if attempt.ok:
            floor = scripts.script(FENCE_FLOOR)
            written = 0
            for client in clients:
                with contextlib.suppress(redis.RedisError):
                    floor(client, self.target.fence_keys,
                          [*attempt.fences, self.target.fencing_ttl_ms])
                    written += 1
            attempt = self._settle(attempt, written)
        if not attempt.ok:
            self.release_quietly(token)  # undo the minority's holds at once
        return attempt

    async def aattempt(self, token: str, keys_: list[str], args: list[Any],
                       ttl: float) -> Attempt:
        clients = self.async_clients()
        lua = scripts.script(self.target.acquire_script)
        started = time.monotonic()

        async def call(client: Any) -> Any:
            try:
                try:
                    return await lua.acall(client, keys_, args)
                except redis.TimeoutError:  # the reply may be all that was lost
                    return await lua.acall(client, keys_, args)
            except redis.RedisError as exc:
                self._member_down(exc)
                return None

        replies = list(await asyncio.gather(*(call(c) for c in clients)))
        if sum(1 for r in replies if r is not None) < self.majority():
            await self.arelease_quietly(token)
            raise self.unavailable("acquire", RuntimeError("too few quorum members answered"))
        attempt = self._decide(replies, started, ttl)
        if attempt.ok:
            floor = scripts.script(FENCE_FLOOR)
            written = await asyncio.gather(
                *(floor.acall(c, self.target.fence_keys,
                              [*attempt.fences, self.target.fencing_ttl_ms]) for c in clients),
                return_exceptions=True,
            )
            attempt = self._settle(
                attempt, sum(1 for w in written if not isinstance(w, BaseException)))
        if not attempt.ok:
            await self.arelease_quietly(token)
        return attempt

    def _member_down(self, exc: Exception) -> None:
        logger.warning("lock %r: quorum member unavailable during acquire: %s",
                       self.target.label, exc)

    def _require_quorum(self, token: str, replies: list[Any]) -> None:
        answered = sum(1 for r in replies if r is not None)
        if answered < self.majority():
            self.release_quietly(token)
            raise self.unavailable(
                "acquire", RuntimeError(f"only {answered} of {len(replies)} quorum members "
                                        "answered"))

    def _decide(self, replies: list[Any], started: float, ttl: float) -> Attempt:
        parsed = [parse_acquire(r) for r in replies if r is not None]
        ok = [a for a in parsed if a.ok]
        validity = ttl - (time.monotonic() - started) - (ttl * DRIFT_FACTOR + 0.002)
        if len(ok) >= self.majority() and validity > 0:
            fences = [max(a.fences[i] for a in ok) for i in range(len(self.target.names))]
            return Attempt(True, fences, validity=validity, started=started)
        return Attempt(False, [], holder_pttl=max((a.holder_pttl for a in parsed), default=-1),
                       started=started)

    def _settle(self, attempt: Attempt, written: int) -> Attempt:
        if written < self.majority():
            return Attempt(False, [], started=attempt.started)
        return attempt

    def count_result(self, results: list[int], error: Exception | None, action: str) -> int:
        # A name counts as ours when a majority still holds our token.
        n = len(self.target.names)
        if sum(1 for r in results if r == n) >= self.majority():
            return n
        if error is not None and len(results) < self.majority():
            raise self.unavailable(action, error)
        return 0
