"""Idempotency keys (SPEC section 4): a retried POST gets the first answer, never a second run.

``from django_redispatterns.idempotency import idempotent`` for one view, or
``django_redispatterns.middleware.IdempotencyMiddleware`` for every view. The Redis side
lives in :mod:`.store` (no HTTP), the Django side in :mod:`.http`, lease renewal for long
views in :mod:`.heartbeat`. See ``docs/idempotency.md``.
"""

from __future__ import annotations

from .http import (
    REPLAYED_HEADER,
    default_scope,
    idempotent,
    idempotent_exempt,
    parse_key,
)
from .store import Claim, Fingerprint, IdempotencyStore, Record, StoredResponse

__all__ = [
    "REPLAYED_HEADER",
    "Claim",
    "Fingerprint",
    "IdempotencyStore",
    "Record",
    "StoredResponse",
    "default_scope",
    "idempotent",
    "idempotent_exempt",
    "parse_key",
]
