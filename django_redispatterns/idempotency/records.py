"""What an idempotency record holds, and its byte layout in Redis. No I/O here.

One Redis string per (scope, key) goes through two states:

* **pending** — ``P <owner token> <fingerprint>``: the claim of the request that runs the
  view. Its TTL is the *lease*.
* **done** — ``D <fingerprint> <json meta>\\n<body bytes>``: status, reason and headers as
  JSON, the body as raw bytes after the first newline. Never pickle: a value is parsed, not
  executed, so a forged record can at worst be reported as unreadable.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from json.encoder import encode_basestring_ascii as _json_string
from typing import Any

PENDING = b"P"
DONE = b"D"
_JSON = json.JSONDecoder()


@dataclass(frozen=True)
class Fingerprint:
    """What identifies *the same request* for one key: method, path+query, content type+body.

    Paths and bodies are kept as digests, so a record never repeats request data.
    """

    method: str
    path: str
    body: str

    @classmethod
    def of(cls, method: str, path: str, query: str | bytes, content_type: str,
           body: bytes | Iterable[bytes]) -> Fingerprint:
        """``query`` is the query string's bytes as the client sent them (text is taken as
        UTF-8); ``body`` is the raw bytes, or chunks (e.g. a parsed multipart form) to hash
        in order."""
        raw_query = query if isinstance(query, bytes) else query.encode("utf-8", "surrogateescape")
        kind = content_type.encode("latin-1", "replace")
        return cls(
            method=method.upper(),
            path=_digest(b"%s\0%s" % (path.encode("utf-8", "surrogateescape"), raw_query)),
            body=(_digest(b"%s\0%s" % (kind, body)) if isinstance(body, bytes)
                  else _digest(kind, b"\0", *body)),
        )

    def encode(self) -> str:
        return f"{self.method}.{self.path}.{self.body}"

    @functools.cached_property
    def encoded(self) -> bytes:
        """:meth:`encode` as the bytes a record holds (made once)."""
        return self.encode().encode()

    @classmethod
    def decode(cls, text: str) -> Fingerprint:
        method, path, body = text.split(".")
        return cls(method, path, body)

    def mismatch(self, other: Fingerprint) -> list[str]:
        """Names of the parts that differ: any of ``method``, ``path``, ``body``."""
        return [name for name in ("method", "path", "body")
                if getattr(self, name) != getattr(other, name)]


def _digest(first: bytes, *more: bytes) -> str:
    h = hashlib.blake2b(first, digest_size=16)
    for part in more:
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
        return b"%s %s %s\n%s" % (DONE, fingerprint.encoded, self._meta().encode(), self.body)

    def _meta(self) -> str:
        """``{"s":status,"r":reason,"h":[[name,value],...]}``: what ``json.dumps`` with
        compact separators and ``ensure_ascii`` gives, written out (a tenth of the time)."""
        reason = "null" if self.reason is None else _json_string(self.reason)
        headers = ",".join([f"[{_json_string(k)},{_json_string(v)}]" for k, v in self.headers])
        return f'{{"s":{int(self.status)},"r":{reason},"h":[{headers}]}}'


@dataclass(frozen=True)
class Claim:
    """Our hold on a key while the view runs. Pass it to ``complete`` or ``release``."""

    redis_key: str
    key_hash: str
    pending: bytes
    lease_ms: int
    connection: str


def pending_value(owner: str, fingerprint: Fingerprint) -> bytes:
    """The value a claim writes: unique to this holder, and naming the request it runs."""
    return b"%s %s %s" % (PENDING, owner.encode(), fingerprint.encoded)


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


class UnreadableRecord(ValueError):
    """A value under our key that we did not write (or a truncated one)."""


def parse_value(value: bytes) -> tuple[bytes, bytes, StoredResponse | None]:
    """Split a stored value into (kind, encoded fingerprint, response-or-None). Never
    executes data. Compare the fingerprint with :attr:`Fingerprint.encoded`, or
    :func:`decode_fingerprint` it."""
    try:
        if value[:2] == PENDING + b" ":
            _, _owner, fp = value.split(b" ", 2)
            return PENDING, fp, None
        if value[:2] == DONE + b" ":
            end = value.index(b"\n")
            _, fp, meta_text = value[:end].split(b" ", 2)
            meta = _JSON.decode(meta_text.decode("ascii"))
            headers = tuple((str(k), str(v)) for k, v in meta["h"])
            response = StoredResponse(int(meta["s"]), headers, value[end + 1:], meta.get("r"))
            return DONE, fp, response
    except (ValueError, KeyError, TypeError) as exc:
        raise UnreadableRecord(str(exc)) from None
    raise UnreadableRecord("unknown record kind")


def decode_fingerprint(encoded: bytes) -> Fingerprint:
    """The :class:`Fingerprint` in a record, or :class:`UnreadableRecord`."""
    try:
        return Fingerprint.decode(encoded.decode("ascii"))
    except ValueError as exc:
        raise UnreadableRecord(str(exc)) from None
