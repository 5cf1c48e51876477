"""Idempotency keys: a retried POST gets the first answer, never a second run.

``from django_redispatterns.idempotency import idempotent`` for one view, or
``django_redispatterns.middleware.IdempotencyMiddleware`` for every view. See
``docs/idempotency.md``.

Inside, bottom to top: :mod:`.records` (what a record holds, its bytes), :mod:`.operations`
(one Redis script or command each), :mod:`.heartbeat` (lease renewal), :mod:`.store`
(claim, complete, release: the decisions, no HTTP), then the Django side: :mod:`.options`
(settings), :mod:`.request` (key, scope, fingerprint of a request), :mod:`.settle` (store or
free a claim however the request ends), :mod:`.decide` (before the view: answer now or take
a claim) and :mod:`.decorators`.
"""

from __future__ import annotations

from .decide import REPLAYED_HEADER
from .decorators import idempotent, idempotent_exempt
from .records import Claim, Fingerprint, Record, StoredResponse
from .request import default_scope, parse_key
from .store import IdempotencyStore

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
