"""Before the view: answer now (replay, 400, 409, 422, 503), or hold a claim for it.

Shared by :class:`~django_redispatterns.middleware.IdempotencyMiddleware` and the
:func:`~django_redispatterns.idempotency.idempotent` decorator; :mod:`.settle` stores or
frees the claim afterwards.
"""

from __future__ import annotations

import logging
from typing import Any, cast

from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse

from .. import signals
from ..exceptions import (
    BackendUnavailable,
    IdempotencyConflict,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
)
from ..problems import problem_response
from .options import AsyncScopeFunc, Options
from .records import Claim, Fingerprint, StoredResponse
from .request import adefault_scope, default_scope, fingerprint, parse_key
from .settle import Ticket
from .store import IdempotencyStore

logger = logging.getLogger("django_redispatterns.idempotency")

REPLAYED_HEADER = "Idempotent-Replayed"
UNAVAILABLE_RETRY_AFTER = 5

Decision = HttpResponse | Ticket | None  # answer now / run the view and settle / not covered


def problem(status: int, code: str, detail: str, **extra: Any) -> HttpResponse:
    """An RFC 9457 problem+json answer; ``code`` is stable and machine-readable."""
    return problem_response(status, code, detail, **extra)


def replay(stored: StoredResponse) -> HttpResponse:
    """The stored answer: status, reason, headers in their order and body, as they were."""
    headers = dict(stored.headers)
    headers[REPLAYED_HEADER] = "true"
    response = HttpResponse(stored.body, status=stored.status, reason=stored.reason,
                            headers=headers)
    if "Content-Type" not in headers and not any(n.lower() == "content-type" for n in headers):
        del response["Content-Type"]  # the view sent none; HttpResponse added its default
    return response


def _precheck(request: HttpRequest, opts: Options) -> HttpResponse | str | None:
    """The parsed key, an error answer, or None when the request is not covered."""
    if not opts.covers(request.method):
        return None
    raw = request.META.get(opts.meta_name)
    if raw is None:
        if opts.required:
            return _invalid(request, "idempotency_key_missing",
                            f"This endpoint requires an {opts.header} header.")
        return None
    try:
        return parse_key(raw)
    except InvalidIdempotencyKey as exc:
        return _invalid(request, "idempotency_key_invalid", f"{opts.header}: {exc}.")


def _invalid(request: HttpRequest, code: str, detail: str) -> HttpResponse:
    signals.idempotency_invalid.send(IdempotencyStore, request=request, code=code)
    return problem(400, code, detail)


def _no_scope(request: HttpRequest, opts: Options) -> HttpResponse:
    return _invalid(request, "idempotency_scope_missing",
                    f"An {opts.header} needs a signed-in user or a session to belong to.")


def start(request: HttpRequest, opts: Options) -> Decision:
    """Decide before the view runs (sync). See the module docstring."""
    key = _precheck(request, opts)
    if not isinstance(key, str):
        return key
    if opts.scope is None:
        scope = default_scope(request)
    elif opts.scope_is_async:
        scope = async_to_sync(cast(AsyncScopeFunc, opts.scope))(request)
    else:
        scope = opts.scope(request)
    if not scope:
        return _no_scope(request, opts)
    fp = fingerprint(request)
    try:
        outcome = opts.store.begin(scope, key, fp, lease=opts.lease, max_lease=opts.max_lease)
    except (IdempotencyConflict, IdempotencyKeyReused, BackendUnavailable) as exc:
        return _refusal(request, exc)
    return _proceed(request, outcome, fp, opts, scope, key)


async def astart(request: HttpRequest, opts: Options) -> Decision:
    """Async twin of :func:`start` (``redis.asyncio``; ``request.auser()``)."""
    key = _precheck(request, opts)
    if not isinstance(key, str):
        return key
    if opts.scope is None:
        scope = await adefault_scope(request)
    elif opts.scope_is_async:
        scope = await cast(AsyncScopeFunc, opts.scope)(request)
    else:
        scope = opts.scope(request)
    if not scope:
        return _no_scope(request, opts)
    fp = fingerprint(request)
    try:
        outcome = await opts.store.abegin(scope, key, fp, lease=opts.lease,
                                          max_lease=opts.max_lease)
    except (IdempotencyConflict, IdempotencyKeyReused, BackendUnavailable) as exc:
        return _refusal(request, exc)
    return _proceed(request, outcome, fp, opts, scope, key)


def _proceed(request: HttpRequest, outcome: Claim | StoredResponse, fp: Fingerprint,
             opts: Options, scope: str, key: str) -> Decision:
    if isinstance(outcome, StoredResponse):
        if signals.idempotent_replayed.has_listeners():
            signals.idempotent_replayed.send(IdempotencyStore, request=request,
                                             key_hash=IdempotencyStore.key_hash(scope, key))
        return replay(outcome)
    return Ticket(outcome, fp, opts)


def _refusal(request: HttpRequest, exc: Exception) -> HttpResponse:
    if isinstance(exc, IdempotencyConflict):
        logger.info("idempotency conflict for %s: %s", exc.key_hash[:12], exc)
        signals.idempotency_conflict.send(IdempotencyStore, request=request,
                                          key_hash=exc.key_hash)
        return problem(409, "idempotency_key_in_use",
                       f"{exc}; retry after the first request finishes.",
                       retry_after=exc.retry_after)
    if isinstance(exc, IdempotencyKeyReused):
        logger.info("idempotency key %s reused with a different %s", exc.key_hash[:12],
                    "/".join(exc.fields))
        signals.idempotency_mismatch.send(IdempotencyStore, request=request,
                                          key_hash=exc.key_hash, fields=exc.fields)
        return problem(422, "idempotency_key_reused",
                       f"This key was used for a request with a different "
                       f"{', '.join(exc.fields)}.", mismatch=list(exc.fields))
    signals.idempotency_unavailable.send(IdempotencyStore, request=request)
    logger.error("idempotency: %s; answering 503 (fail closed: without Redis no request "
                 "can be promised to run at most once)", exc)
    return problem(503, "idempotency_unavailable",
                   "Idempotency records cannot be reached; the request was not run.",
                   retry_after=UNAVAILABLE_RETRY_AFTER)
