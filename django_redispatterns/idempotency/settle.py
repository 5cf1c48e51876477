"""After the view: every way a request ends settles its claim exactly once (stored, or freed).

The view's response may be final (settled now), lazily rendered (settled once rendered,
freed if rendering raises or if the response is dropped unrendered), streaming (freed when
the server closes it), or not a response at all (freed now; Django then answers 500). A
Redis call that cannot be made or awaited any more (a cancelled task, the garbage
collector) hands the claim to the heartbeat thread, which frees it.
"""

from __future__ import annotations

import functools
import logging
import threading
import weakref
from dataclasses import dataclass
from http.client import responses
from typing import Any

import redis
from django.http import HttpResponse, HttpResponseBase

from .. import signals
from . import heartbeat
from .options import Options
from .records import Claim, Fingerprint, StoredResponse

logger = logging.getLogger("django_redispatterns.idempotency")

# RFC 9110 section 7.6.1 hop-by-hop fields, plus cookies (never replayed to anyone).
NOT_STORED_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "set-cookie",
})
# Statuses that mean "not processed, try later": released like a 5xx, never replayed.
NOT_STORED_STATUSES = frozenset({429})


@dataclass(eq=False)
class Ticket:
    """A claim held for one request, and what is needed to settle it (store or free)."""

    claim: Claim
    fingerprint: Fingerprint
    options: Options
    settled: bool = False

    def take(self) -> bool:
        """True for the one caller that settles this ticket; False for every later one."""
        with _SETTLING:
            if self.settled:
                return False
            self.settled = True
            return True


_SETTLING = threading.Lock()  # a ticket may be settled from the GC or a server's thread


def to_stored(response: HttpResponse, content: bytes | None = None) -> StoredResponse:
    headers = tuple((k, v) for k, v in response.items() if k.lower() not in NOT_STORED_HEADERS)
    reason = response.reason_phrase
    default = responses.get(response.status_code, "Unknown Status Code")
    return StoredResponse(response.status_code, headers,
                          response.content if content is None else content,
                          None if reason == default else reason)


_RELEASE = "release"  # what _plan answers when the key must be freed now


def _plan(ticket: Ticket, response: HttpResponseBase) -> StoredResponse | str | None:
    """What to store; ``_RELEASE`` to free the key now; None when a streaming response will
    free it once the server closes it (duplicates meanwhile get 409)."""
    if response.status_code >= 500 or response.status_code in NOT_STORED_STATUSES:
        return _RELEASE
    if response.streaming or not isinstance(response, HttpResponse):
        response._resource_closers.append(  # type: ignore[attr-defined]
            functools.partial(release, ticket))
        return None
    content = response.content
    size = len(content)
    if size > ticket.options.max_body_bytes:
        logger.warning("idempotency: response for %s is %d bytes (MAX_BODY_BYTES %d); passed "
                       "through unstored and the key freed", ticket.claim.key_hash[:12], size,
                       ticket.options.max_body_bytes)
        return _RELEASE
    return to_stored(response, content)


def finish(ticket: Ticket, response: Any) -> Any:
    """Store ``response`` for replay, or free the key (sync). Returns ``response``."""
    if not isinstance(response, HttpResponseBase):  # None, or not a response at all
        release(ticket)
        return response
    if _needs_render(response):
        _settle_when_rendered(ticket, response)
        return response
    try:
        plan = _plan(ticket, response)
    except BaseException:
        release(ticket)
        raise
    if plan == _RELEASE:
        release(ticket)
    elif isinstance(plan, StoredResponse):
        _store(ticket, plan)
    return response


async def afinish(ticket: Ticket, response: Any) -> Any:
    """Async twin of :func:`finish`."""
    if not isinstance(response, HttpResponseBase):
        await arelease(ticket)
        return response
    if _needs_render(response):
        _settle_when_rendered(ticket, response)  # Django renders it in a thread
        return response
    try:
        plan = _plan(ticket, response)
    except BaseException:
        await arelease(ticket)
        raise
    if plan == _RELEASE:
        await arelease(ticket)
    elif isinstance(plan, StoredResponse):
        await _astore(ticket, plan)
    return response


def _needs_render(response: HttpResponseBase) -> bool:
    return callable(getattr(response, "render", None)) and not getattr(
        response, "is_rendered", True)


def _settle_when_rendered(ticket: Ticket, response: HttpResponseBase) -> None:
    """Settle ``ticket`` once Django renders ``response`` (after every post-render callback
    and ``process_template_response``), free it if rendering raises, and free it too if the
    response is dropped without ever being rendered (a later middleware replaced it or
    failed): then the heartbeat thread frees it once the response is garbage."""
    own = response.__dict__.get("render")  # an instance-level render someone set before us
    ref = weakref.ref(response)  # the wrapper must not keep the response alive
    abandoned = weakref.finalize(response, _abandon, ticket)
    abandoned.atexit = False

    def render() -> Any:
        target = ref()
        assert target is not None  # Django calls response.render(): the response is alive
        abandoned.detach()
        try:
            rendered = own() if own is not None else type(target).render(target)  # type: ignore[attr-defined]
        except BaseException:
            release(ticket)
            raise
        finish(ticket, rendered)
        return rendered

    response.render = render  # type: ignore[attr-defined]


def _abandon(ticket: Ticket) -> None:
    # Runs wherever the garbage collector runs (maybe an event loop): no Redis call here.
    if ticket.take():
        heartbeat.release_later(ticket.claim)


def _store(ticket: Ticket, plan: StoredResponse) -> None:
    if not ticket.take():
        return
    try:
        kept = ticket.options.store.complete(ticket.claim, plan, ticket.fingerprint,
                                             ttl=ticket.options.ttl)
    except redis.RedisError as exc:
        _log_not_stored(ticket, exc)
    except BaseException:
        heartbeat.release_later(ticket.claim)
        raise
    else:
        _check_kept(ticket, kept, plan)


async def _astore(ticket: Ticket, plan: StoredResponse) -> None:
    if not ticket.take():
        return
    try:
        kept = await ticket.options.store.acomplete(ticket.claim, plan, ticket.fingerprint,
                                                    ttl=ticket.options.ttl)
    except redis.RedisError as exc:
        _log_not_stored(ticket, exc)
    except BaseException:  # cancelled mid-call: stored or not, an owner-checked free is right
        heartbeat.release_later(ticket.claim)
        raise
    else:
        _check_kept(ticket, kept, plan)


def release(ticket: Ticket) -> None:
    """Free the key after a failure; never raises a Redis error (the lease ends it then)."""
    if not ticket.take():
        return
    try:
        ticket.options.store.release(ticket.claim)
    except redis.RedisError as exc:
        _log_not_freed(ticket, exc)
    except BaseException:
        heartbeat.release_later(ticket.claim)
        raise


async def arelease(ticket: Ticket) -> None:
    """Async twin of :func:`release`; cancelled mid-call, the heartbeat thread frees it."""
    if not ticket.take():
        return
    try:
        await ticket.options.store.arelease(ticket.claim)
    except redis.RedisError as exc:
        _log_not_freed(ticket, exc)
    except BaseException:
        heartbeat.release_later(ticket.claim)
        raise


def _log_not_freed(ticket: Ticket, exc: Exception) -> None:
    logger.warning("idempotency: could not free %s (%s); its lease ends in %.0f s",
                   ticket.claim.key_hash[:12], exc, ticket.claim.lease_ms / 1000)


def _log_not_stored(ticket: Ticket, exc: Exception) -> None:
    logger.error("idempotency: the view ran but its response for %s was not stored (%s); a "
                 "retry after the lease (%.0f s) runs the view again", ticket.claim.key_hash[:12],
                 exc, ticket.claim.lease_ms / 1000)


def _check_kept(ticket: Ticket, kept: bool, plan: StoredResponse) -> None:
    if kept:
        if signals.idempotency_stored.receivers:
            signals.idempotency_stored.send(type(ticket.options.store),
                                            key_hash=ticket.claim.key_hash, status=plan.status)
        return
    logger.warning("idempotency: the claim for %s ended before the view finished (lease %.0f s);"
                   " its response was not stored", ticket.claim.key_hash[:12],
                   ticket.claim.lease_ms / 1000)
