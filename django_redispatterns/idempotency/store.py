"""The Redis side of idempotency keys: claim, complete, release, look up. No HTTP here.

One Redis string per (scope, key) goes through two states:

* **pending** — ``P <owner token> <fingerprint>``, written by one ``SET NX PX`` (inside
  ``lua/idempotency_claim.lua``, which also reads the current value when the key exists, so
  every first-or-duplicate decision is one round trip). Its TTL is the *lease*; a process
  that dies mid-request frees the key when the lease ends, and a live one renews it (see
  :mod:`.heartbeat`).
* **done** — ``D <fingerprint> <json meta>\\n<body bytes>``: status, reason and headers as
  JSON, the body as raw bytes after the first newline. Never pickle: the value is parsed,
  not executed, so a forged record can at worst be reported as unreadable.

Completing and releasing are owner-checked scripts: they act only if the key still holds
*our* pending value, so a worker whose lease ran out cannot overwrite or delete the claim
of the worker that took over.
"""

from __future__ import annotations

import hashlib
import json
import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import redis

from .. import connection, keys, scripts
from ..exceptions import BackendUnavailable, IdempotencyConflict, IdempotencyKeyReused
from . import heartbeat

logger = logging.getLogger("django_redispatterns.idempotency")

FEATURE = "idem"
_PENDING = b"P"
_DONE = b"D"


@dataclass(frozen=True)
class Fingerprint:
    """What identifies *the same request* for one key: method, path+query, content type+body.

    Paths and bodies are kept as digests, so a record never repeats request data.
    """

    method: str
    path: str
    body: str

    @classmethod
    def of(cls, method: str, path: str, query: str, content_type: str,
           body: bytes | Iterable[bytes]) -> Fingerprint:
        """``body`` is the raw bytes, or chunks (e.g. a parsed multipart form) to hash in order."""
        chunks = (body,) if isinstance(body, bytes) else body
        return cls(
            method=method.upper(),
            path=_digest(path.encode("utf-8", "surrogateescape"), b"\0",
                         query.encode("latin-1", "replace")),
            body=_digest(content_type.encode("latin-1", "replace"), b"\0", *chunks),
        )

    def encode(self) -> str:
        return f"{self.method}.{self.path}.{self.body}"

    @classmethod
    def decode(cls, text: str) -> Fingerprint:
        method, path, body = text.split(".")
        return cls(method, path, body)

    def mismatch(self, other: Fingerprint) -> list[str]:
        """Names of the parts that differ: any of ``method``, ``path``, ``body``."""
        return [name for name in ("method", "path", "body")
                if getattr(self, name) != getattr(other, name)]


def _digest(*parts: bytes) -> str:
    h = hashlib.blake2b(digest_size=16)
    for part in parts:
        h.update(part)
    return h.hexdigest()


@dataclass(frozen=True)
class StoredResponse:
    """A response as stored and replayed: status, reason, headers (in order) and body bytes."""

    status: int
    headers: tuple[tuple[str, str], ...]
    body: bytes
    reason: str | None = None

    def encode(self, fingerprint: Fingerprint) -> bytes:
        meta = json.dumps({"s": self.status, "r": self.reason, "h": self.headers},
                          separators=(",", ":"), ensure_ascii=True)
        return b"%s %s %s\n%s" % (_DONE, fingerprint.encode().encode(), meta.encode(), self.body)


@dataclass(frozen=True)
class Claim:
    """Our hold on a key while the view runs. Pass it to ``complete`` or ``release``."""

    redis_key: str
    key_hash: str
    pending: bytes
    lease_ms: int
    connection: str


@dataclass(frozen=True)
class Record:
    """What an operator sees for a key (see :meth:`IdempotencyStore.lookup`)."""

    key_hash: str
    redis_key: str
    state: str  # "in_flight" or "stored"
    ttl_ms: int
    fingerprint: Fingerprint | None
    response: StoredResponse | None = None
    extra: dict[str, Any] = field(default_factory=dict)


Outcome = Claim | StoredResponse


class UnreadableRecord(ValueError):
    """A value under our key that we did not write (or a truncated one)."""


def parse_value(value: bytes) -> tuple[bytes, Fingerprint, StoredResponse | None]:
    """Split a stored value into (kind, fingerprint, response-or-None). Never executes data."""
    try:
        if value[:2] == _PENDING + b" ":
            _, _owner, fp = value.split(b" ", 2)
            return _PENDING, Fingerprint.decode(fp.decode("ascii")), None
        if value[:2] == _DONE + b" ":
            head, body = value.split(b"\n", 1)
            _, fp, meta_text = head.split(b" ", 2)
            meta = json.loads(meta_text)
            headers = tuple((str(k), str(v)) for k, v in meta["h"])
            response = StoredResponse(int(meta["s"]), headers, body, meta.get("r"))
            return _DONE, Fingerprint.decode(fp.decode("ascii")), response
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableRecord(str(exc)) from None
    raise UnreadableRecord("unknown record kind")


class IdempotencyStore:
    """Idempotency records in Redis for one connection (a CACHES alias or a URL).

    Guarantees, for a given ``(scope, key)``:

    * at most one caller holds the claim while its lease lasts (one ``SET NX PX``);
    * a stored response is only written over *our* claim, and only once;
    * every key has a TTL: the lease while in flight, ``ttl`` once stored;
    * key names hold ``HMAC(scope, key)`` only — no raw key, no user id.
    """

    def __init__(self, connection_name: str) -> None:
        self.connection = connection_name

    # --- naming -------------------------------------------------------------------------

    @staticmethod
    def key_hash(scope: str, key: str) -> str:
        """The keyed digest naming ``key`` within ``scope`` (also what logs and signals show)."""
        return keys.identity_hash(f"{scope}\0{key}", purpose="idempotency")

    @classmethod
    def redis_key(cls, scope: str, key: str) -> tuple[str, str]:
        digest = cls.key_hash(scope, key)
        return keys.make_key(FEATURE, digest), digest

    # --- the request path ---------------------------------------------------------------

    def _claim_args(self, scope: str, key: str, fingerprint: Fingerprint,
                    lease: float) -> Claim:
        redis_key, digest = self.redis_key(scope, key)
        owner = secrets.token_hex(16)
        pending = b"%s %s %s" % (_PENDING, owner.encode(), fingerprint.encode().encode())
        return Claim(redis_key, digest, pending, max(1, int(lease * 1000)), self.connection)

    def begin(self, scope: str, key: str, fingerprint: Fingerprint, *, lease: float) -> Outcome:
        """Claim ``key`` for a first run, or return the response stored for it.

        Returns a :class:`Claim` (run the view, then :meth:`complete` or :meth:`release`)
        or the :class:`StoredResponse` to replay. Raises :class:`IdempotencyConflict` while
        another holder's claim is live, :class:`IdempotencyKeyReused` (``.fields`` names the
        mismatch) for another request under the same key, :class:`BackendUnavailable` when
        Redis cannot answer. One round trip.
        """
        claim = self._claim_args(scope, key, fingerprint, lease)
        try:
            client = connection.client_for(self.connection)
            result = scripts.script("idempotency_claim")(
                client, [claim.redis_key], [claim.pending, claim.lease_ms])
        except redis.RedisError as exc:
            raise _unavailable(exc, claim) from exc
        return self._decide(claim, fingerprint, result)

    async def abegin(self, scope: str, key: str, fingerprint: Fingerprint, *,
                     lease: float) -> Outcome:
        """Async twin of :meth:`begin` (``redis.asyncio``)."""
        claim = self._claim_args(scope, key, fingerprint, lease)
        try:
            client = connection.async_client_for(self.connection)
            result = await scripts.script("idempotency_claim").acall(
                client, [claim.redis_key], [claim.pending, claim.lease_ms])
        except redis.RedisError as exc:
            raise _unavailable(exc, claim) from exc
        return self._decide(claim, fingerprint, result)

    def _decide(self, claim: Claim, fingerprint: Fingerprint, result: list[Any]) -> Outcome:
        if result[0] == 1 or (len(result) > 1 and result[1] == claim.pending):
            # Taken now, or by our own earlier send of this very call (SPEC D4).
            heartbeat.watch(claim)
            return claim
        value, pttl = result[1], int(result[2])
        if value is None:  # expired between SET NX and GET: the holder just went away
            raise _conflict(claim, retry_after=0, why="a previous claim just ended")
        try:
            kind, stored_fp, response = parse_value(value)
        except UnreadableRecord as exc:
            logger.error("idempotency record %s is unreadable (%s); answering 409 until it "
                         "expires or an operator deletes it", claim.key_hash[:12], exc)
            raise _conflict(claim, retry_after=max(1, pttl // 1000),
                            why="the stored record is unreadable") from None
        fields = stored_fp.mismatch(fingerprint)
        if fields:
            raise IdempotencyKeyReused(
                f"idempotency key reused with a different {', '.join(fields)}",
                fields=tuple(fields), key_hash=claim.key_hash)
        if kind == _PENDING:
            raise _conflict(claim, retry_after=1, why="a request with this key is in flight")
        assert response is not None
        return response

    def complete(self, claim: Claim, response: StoredResponse, fingerprint: Fingerprint, *,
                 ttl: float) -> bool:
        """Store ``response`` in place of ``claim`` for ``ttl`` seconds, if the claim is still ours.

        Returns False when the claim was lost (lease ended and someone else took the key, or an
        operator deleted it); the response is then not stored. Raises ``redis.RedisError``.
        """
        heartbeat.unwatch(claim)
        client = connection.client_for(self.connection)
        return bool(scripts.script("idempotency_complete")(
            client, [claim.redis_key], _complete_args(claim, response, fingerprint, ttl)))

    async def acomplete(self, claim: Claim, response: StoredResponse, fingerprint: Fingerprint,
                        *, ttl: float) -> bool:
        """Async twin of :meth:`complete`."""
        heartbeat.unwatch(claim)
        client = connection.async_client_for(self.connection)
        return bool(await scripts.script("idempotency_complete").acall(
            client, [claim.redis_key], _complete_args(claim, response, fingerprint, ttl)))

    def release(self, claim: Claim) -> bool:
        """Free the key so a retry runs again (only if the claim is still ours)."""
        heartbeat.unwatch(claim)
        client = connection.client_for(self.connection)
        return bool(scripts.script("idempotency_release")(
            client, [claim.redis_key], [claim.pending]))

    async def arelease(self, claim: Claim) -> bool:
        """Async twin of :meth:`release`."""
        heartbeat.unwatch(claim)
        client = connection.async_client_for(self.connection)
        return bool(await scripts.script("idempotency_release").acall(
            client, [claim.redis_key], [claim.pending]))

    # --- operators ----------------------------------------------------------------------

    def lookup(self, scope: str, key: str) -> Record | None:
        """The record for ``(scope, key)``, or None. Unreadable values come back with
        ``state="unreadable"``."""
        redis_key, digest = self.redis_key(scope, key)
        client = connection.client_for(self.connection)
        pipe = client.pipeline(transaction=False)
        pipe.get(redis_key)
        pipe.pttl(redis_key)
        value, pttl = pipe.execute()
        if value is None:
            return None
        try:
            kind, fp, response = parse_value(value)
        except UnreadableRecord as exc:
            return Record(digest, redis_key, "unreadable", int(pttl), None,
                          extra={"error": str(exc), "size": len(value)})
        state = "in_flight" if kind == _PENDING else "stored"
        return Record(digest, redis_key, state, int(pttl), fp, response)

    def delete(self, scope: str, key: str) -> bool:
        """Delete the record (stored or in flight): the next request with the key runs anew."""
        redis_key, _ = self.redis_key(scope, key)
        return bool(connection.client_for(self.connection).delete(redis_key))

    def scan(self, count: int = 500) -> Iterable[bytes]:
        """Every idempotency key name under this app's prefix (SCAN, never KEYS)."""
        client = connection.client_for(self.connection)
        return client.scan_iter(match=keys.feature_pattern(FEATURE), count=count)


def _complete_args(claim: Claim, response: StoredResponse, fingerprint: Fingerprint,
                   ttl: float) -> list[Any]:
    return [claim.pending, response.encode(fingerprint), max(1, int(ttl * 1000))]


def _conflict(claim: Claim, *, retry_after: int, why: str) -> IdempotencyConflict:
    return IdempotencyConflict(why, retry_after=retry_after, key_hash=claim.key_hash)


def _unavailable(exc: redis.RedisError, claim: Claim) -> Exception:
    if isinstance(exc, redis.ResponseError) and str(exc).startswith("WRONGTYPE"):
        # Someone wrote another type under our key: same answer as an unreadable record.
        logger.error("idempotency record %s has the wrong Redis type", claim.key_hash[:12])
        return _conflict(claim, retry_after=1, why="the stored record is unreadable")
    return BackendUnavailable(f"Redis unavailable for idempotency: {exc}")
