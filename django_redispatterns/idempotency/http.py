"""The Django side: requests in, responses out, the store in between.

Shared by :class:`~django_redispatterns.middleware.IdempotencyMiddleware` and the
:func:`idempotent` decorator. :func:`start` / :func:`astart` decide before the view runs
(answer now, or hold a claim); :func:`finish` / :func:`afinish` store or release afterwards.
"""

from __future__ import annotations

import functools
import logging
import re
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, replace
from http.client import responses
from importlib import import_module
from inspect import iscoroutinefunction
from typing import Any, TypeVar, cast

import redis
from asgiref.sync import async_to_sync
from django.http import HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import RawPostDataException

from .. import signals
from ..conf import get_config
from ..exceptions import (
    BackendUnavailable,
    ConfigurationError,
    IdempotencyConflict,
    IdempotencyKeyReused,
    InvalidIdempotencyKey,
)
from ..problems import problem_response
from .store import Claim, Fingerprint, IdempotencyStore, StoredResponse

logger = logging.getLogger("django_redispatterns.idempotency")

REPLAYED_HEADER = "Idempotent-Replayed"
MAX_KEY_LENGTH = 255
UNAVAILABLE_RETRY_AFTER = 5
# RFC 9110 section 7.6.1 hop-by-hop fields, plus cookies (never replayed to anyone).
NOT_STORED_HEADERS = frozenset({
    "connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "proxy-connection",
    "te", "trailer", "trailers", "transfer-encoding", "upgrade", "set-cookie",
})
# Statuses that mean "not processed, try later": released like a 5xx, never replayed.
NOT_STORED_STATUSES = frozenset({429})

ScopeFunc = Callable[[HttpRequest], "str | None"]
V = TypeVar("V", bound=Callable[..., Any])


# --- options -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Options:
    """One view's effective settings: ``IDEMPOTENCY`` merged with decorator overrides."""

    header: str
    meta_name: str
    ttl: float
    lease: float
    methods: frozenset[str]
    required: bool
    max_body_bytes: int
    scope: ScopeFunc | None  # None: user id, else session key
    store: IdempotencyStore

    def covers(self, method: str | None) -> bool:
        return method is not None and method.upper() in self.methods


def _meta_name(header: str) -> str:
    return "HTTP_" + header.upper().replace("-", "_")


@functools.lru_cache(maxsize=16)  # keyed by the Config object: settings changes make a new one
def _options_for(config: Any) -> Options:
    section = config.feature("IDEMPOTENCY")
    _validate(section)
    scope = section["SCOPE"]
    return Options(
        header=section["HEADER"],
        meta_name=_meta_name(section["HEADER"]),
        ttl=float(section["TTL"]),
        lease=float(section["LEASE"]),
        methods=frozenset(m.upper() for m in section["METHODS"]),
        required=section["REQUIRED"],
        max_body_bytes=section["MAX_BODY_BYTES"],
        scope=_import_scope(scope) if scope else None,
        store=IdempotencyStore(config.connection_for("IDEMPOTENCY")),
    )


def _validate(section: Any) -> None:
    where = "REDIS_PATTERNS['IDEMPOTENCY']"
    methods = section["METHODS"]
    if not all(isinstance(m, str) and m.isalpha() for m in methods):
        raise ConfigurationError(f"{where}['METHODS'] must list HTTP method names, got "
                                 f"{methods!r}.")
    if not re.fullmatch(r"[A-Za-z0-9-]+", section["HEADER"]):
        raise ConfigurationError(f"{where}['HEADER'] must be a header name, got "
                                 f"{section['HEADER']!r}.")
    if section["MAX_BODY_BYTES"] < 0:
        raise ConfigurationError(f"{where}['MAX_BODY_BYTES'] must be >= 0.")


def _import_scope(path: str) -> ScopeFunc:
    module, _, name = path.rpartition(".")
    try:
        return cast(ScopeFunc, getattr(import_module(module), name))
    except (ImportError, AttributeError, ValueError) as exc:
        raise ConfigurationError(
            f"REDIS_PATTERNS['IDEMPOTENCY']['SCOPE'] = {path!r} cannot be imported: {exc}"
        ) from exc


Overrides = tuple[tuple[str, Any], ...]


def options(**overrides: Any) -> Options:
    """The settings in force now, with ``overrides`` (non-None values) applied."""
    return _current(_overrides(overrides))


def _overrides(given: dict[str, Any]) -> Overrides:
    """Validated decorator arguments (None means "use the setting"), sorted by name: made
    once per decorated view, they key the cache of its effective :class:`Options`."""
    out = {k: v for k, v in given.items() if v is not None}
    if "methods" in out:
        out["methods"] = frozenset(m.upper() for m in out["methods"])
    for name in ("ttl", "lease", "max_body_bytes"):
        if name in out and not (isinstance(out[name], (int, float)) and out[name] > 0):
            raise ConfigurationError(f"@idempotent({name}=...) must be > 0, got {out[name]!r}")
    return tuple(sorted(out.items()))


@functools.lru_cache(maxsize=256)
def _apply_cached(base: Options, overrides: Overrides) -> Options:
    return replace(base, **dict(overrides))


def _current(overrides: Overrides) -> Options:
    """The settings in force now (cached per Config) with ``overrides`` applied."""
    base = _options_for(get_config())
    return _apply_cached(base, overrides) if overrides else base


# --- the key, the scope, the fingerprint --------------------------------------------------


def parse_key(raw: str) -> str:
    """The idempotency key in a header value, or :class:`InvalidIdempotencyKey`.

    Accepts the IETF draft's RFC 8941 sf-string (``"abc"``) and the bare form Stripe uses
    (``abc``). A key is 1-255 printable ASCII characters; a bare key may not contain a comma
    (that is what two ``Idempotency-Key`` headers look like once joined).
    """
    value = raw.strip(" \t")
    if value.startswith('"'):
        key = _unquote_sf_string(value)
    else:
        if "," in value:
            raise InvalidIdempotencyKey("more than one key (a comma in a bare key)")
        key = value
    if not key:
        raise InvalidIdempotencyKey("the key is empty")
    if len(key) > MAX_KEY_LENGTH:
        raise InvalidIdempotencyKey(f"the key is longer than {MAX_KEY_LENGTH} characters")
    if not all(" " <= c <= "~" for c in key):
        raise InvalidIdempotencyKey("the key must be printable ASCII (no control characters)")
    return key


def _unquote_sf_string(value: str) -> str:
    out: list[str] = []
    i = 1
    while i < len(value):
        c = value[i]
        if c == "\\":
            if i + 1 >= len(value) or value[i + 1] not in '"\\':
                raise InvalidIdempotencyKey("bad escape in the quoted key")
            out.append(value[i + 1])
            i += 2
            continue
        if c == '"':
            if i != len(value) - 1:
                raise InvalidIdempotencyKey("text after the closing quote")
            return "".join(out)
        out.append(c)
        i += 1
    raise InvalidIdempotencyKey("unterminated quoted key")


def default_scope(request: HttpRequest) -> str | None:
    """``user:<pk>`` for an authenticated user, else ``session:<key>``, else None."""
    user = getattr(request, "user", None)
    if user is not None and user.is_authenticated:
        return f"user:{user.pk}"
    return _session_scope(request)


async def adefault_scope(request: HttpRequest) -> str | None:
    """Async twin of :func:`default_scope` (``request.auser()``: no sync DB access)."""
    auser = getattr(request, "auser", None)
    if auser is not None:
        user = await auser()
        if user.is_authenticated:
            return f"user:{user.pk}"
        return _session_scope(request)
    from asgiref.sync import sync_to_async

    return await sync_to_async(default_scope)(request)


def _session_scope(request: HttpRequest) -> str | None:
    session = getattr(request, "session", None)
    key = getattr(session, "session_key", None) if session is not None else None
    return f"session:{key}" if key else None


def fingerprint(request: HttpRequest) -> Fingerprint:
    """Method, path + query, content type + body of ``request``.

    Multipart bodies are fingerprinted as their parsed fields and files (names, sizes,
    contents), without the boundary: a browser re-submitting a form picks a new boundary,
    and a middleware that read ``request.POST`` first leaves no raw body to hash.
    """
    content_type = request.META.get("CONTENT_TYPE", "")
    body: bytes | Iterator[bytes]
    if content_type.lower().startswith("multipart/"):
        content_type, body = content_type.split(";", 1)[0], _form_chunks(request)
    else:
        try:
            body = request.body
        except RawPostDataException:  # the stream was consumed by request.POST
            body = _form_chunks(request)
    return Fingerprint.of(request.method or "", request.path,
                          request.META.get("QUERY_STRING", ""), content_type, body)


def _form_chunks(request: HttpRequest) -> Iterator[bytes]:
    for name in sorted(request.POST):
        for value in request.POST.getlist(name):
            yield b"field\0%s\0%s\0" % (name.encode(), value.encode())
    for name in sorted(request.FILES):
        for upload in request.FILES.getlist(name):
            yield b"file\0%s\0%s\0%d\0" % (name.encode(), (upload.name or "").encode(),
                                                upload.size or 0)
            yield from upload.chunks()
            upload.seek(0)


# --- answers -----------------------------------------------------------------------------


def problem(status: int, code: str, detail: str, **extra: Any) -> HttpResponse:
    """An RFC 9457 problem+json answer; ``code`` is stable and machine-readable."""
    return problem_response(status, code, detail, **extra)


def replay(stored: StoredResponse) -> HttpResponse:
    response = HttpResponse(stored.body, status=stored.status, reason=stored.reason)
    del response["Content-Type"]
    for name, value in stored.headers:
        response[name] = value
    response[REPLAYED_HEADER] = "true"
    return response


def to_stored(response: HttpResponse) -> StoredResponse:
    headers = tuple((k, v) for k, v in response.items() if k.lower() not in NOT_STORED_HEADERS)
    reason = response.reason_phrase
    default = responses.get(response.status_code, "Unknown Status Code")
    return StoredResponse(response.status_code, headers, response.content,
                          None if reason == default else reason)


# --- before the view ---------------------------------------------------------------------


@dataclass
class Ticket:
    """A claim held for one request, and what is needed to finish it."""

    claim: Claim
    fingerprint: Fingerprint
    options: Options


Decision = HttpResponse | Ticket | None  # answer now / run the view and finish / not covered


def _precheck(request: HttpRequest, opts: Options) -> HttpResponse | str | None:
    """The parsed key, an error answer, or None when the request is not covered."""
    if not opts.covers(request.method):
        return None
    raw = request.META.get(opts.meta_name)
    if raw is None:
        if opts.required:
            return problem(400, "idempotency_key_missing",
                           f"This endpoint requires an {opts.header} header.")
        return None
    try:
        return parse_key(raw)
    except InvalidIdempotencyKey as exc:
        return problem(400, "idempotency_key_invalid", f"{opts.header}: {exc}.")


def _no_scope(opts: Options) -> HttpResponse:
    return problem(400, "idempotency_scope_missing",
                   f"An {opts.header} needs a signed-in user or a session to belong to.")


def start(request: HttpRequest, opts: Options) -> Decision:
    """Decide before the view runs (sync). See the module docstring."""
    key = _precheck(request, opts)
    if not isinstance(key, str):
        return key
    if opts.scope is None:
        scope = default_scope(request)
    elif iscoroutinefunction(opts.scope):
        scope = async_to_sync(opts.scope)(request)
    else:
        scope = opts.scope(request)
    if not scope:
        return _no_scope(opts)
    fp = fingerprint(request)
    try:
        outcome = opts.store.begin(scope, key, fp, lease=opts.lease)
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
    elif iscoroutinefunction(opts.scope):
        scope = await opts.scope(request)
    else:
        scope = opts.scope(request)
    if not scope:
        return _no_scope(opts)
    fp = fingerprint(request)
    try:
        outcome = await opts.store.abegin(scope, key, fp, lease=opts.lease)
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
    logger.error("idempotency: %s; answering 503 (fail closed: SPEC D3)", exc)
    return problem(503, "idempotency_unavailable",
                   "Idempotency records cannot be reached; the request was not run.",
                   retry_after=UNAVAILABLE_RETRY_AFTER)


# --- after the view ----------------------------------------------------------------------


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
    size = len(response.content)
    if size > ticket.options.max_body_bytes:
        logger.warning("idempotency: response for %s is %d bytes (MAX_BODY_BYTES %d); passed "
                       "through unstored and the key freed", ticket.claim.key_hash[:12], size,
                       ticket.options.max_body_bytes)
        return _RELEASE
    return to_stored(response)


def finish(ticket: Ticket, response: HttpResponseBase) -> HttpResponseBase:
    """Store ``response`` for replay, or free the key (sync). Returns ``response``."""
    if _needs_render(response):
        response.add_post_render_callback(  # type: ignore[attr-defined]
            lambda rendered: finish(ticket, rendered))
        return response
    plan = _plan(ticket, response)
    if plan == _RELEASE:
        release(ticket)
    elif isinstance(plan, StoredResponse):
        try:
            kept = ticket.options.store.complete(ticket.claim, plan, ticket.fingerprint,
                                                 ttl=ticket.options.ttl)
        except redis.RedisError as exc:
            _log_not_stored(ticket, exc)
        else:
            _check_kept(ticket, kept)
    return response


async def afinish(ticket: Ticket, response: HttpResponseBase) -> HttpResponseBase:
    """Async twin of :func:`finish`."""
    if _needs_render(response):
        return finish(ticket, response)  # rendering (and our callback) happens in a thread
    plan = _plan(ticket, response)
    if plan == _RELEASE:
        await arelease(ticket)
    elif isinstance(plan, StoredResponse):
        try:
            kept = await ticket.options.store.acomplete(ticket.claim, plan, ticket.fingerprint,
                                                        ttl=ticket.options.ttl)
        except redis.RedisError as exc:
            _log_not_stored(ticket, exc)
        else:
            _check_kept(ticket, kept)
    return response


def _needs_render(response: HttpResponseBase) -> bool:
    return callable(getattr(response, "render", None)) and not getattr(
        response, "is_rendered", True)


def release(ticket: Ticket) -> None:
    """Free the key after a failure; never raises (the lease ends it otherwise)."""
    try:
        ticket.options.store.release(ticket.claim)
    except redis.RedisError as exc:
        _log_not_freed(ticket, exc)


async def arelease(ticket: Ticket) -> None:
    """Async twin of :func:`release`."""
    try:
        await ticket.options.store.arelease(ticket.claim)
    except redis.RedisError as exc:
        _log_not_freed(ticket, exc)


def _log_not_freed(ticket: Ticket, exc: Exception) -> None:
    logger.warning("idempotency: could not free %s (%s); its lease ends in %.0f s",
                   ticket.claim.key_hash[:12], exc, ticket.claim.lease_ms / 1000)


def _log_not_stored(ticket: Ticket, exc: Exception) -> None:
    logger.error("idempotency: the view ran but its response for %s was not stored (%s); a "
                 "retry after the lease (%.0f s) runs the view again", ticket.claim.key_hash[:12],
                 exc, ticket.claim.lease_ms / 1000)


def _check_kept(ticket: Ticket, kept: bool) -> None:
    if kept:
        return
    logger.warning("idempotency: the claim for %s ended before the view finished (lease %.0f s);"
                   " its response was not stored", ticket.claim.key_hash[:12],
                   ticket.claim.lease_ms / 1000)


# --- the decorators ----------------------------------------------------------------------

HANDLED_ATTR = "idempotency_handled"


def idempotent(
    view: V | None = None,
    *,
    ttl: float | None = None,
    required: bool | None = None,
    methods: Collection[str] | None = None,
    lease: float | None = None,
    max_body_bytes: int | None = None,
    scope: ScopeFunc | None = None,
) -> Any:
    """Make a view (sync or async) honour ``Idempotency-Key`` as SPEC section 4 says.

    Arguments override ``REDIS_PATTERNS['IDEMPOTENCY']`` for this view. ``scope`` is a
    callable ``request -> str | None`` naming whom the keys belong to (default: the user id,
    else the session key). Usable bare (``@idempotent``) or with arguments. With the
    middleware installed as well, the decorator's settings win for this view.
    """
    overrides = _overrides({"ttl": ttl, "required": required, "methods": methods,
                            "lease": lease, "max_body_bytes": max_body_bytes, "scope": scope})

    def decorate(func: V) -> V:
        if iscoroutinefunction(func):
            @functools.wraps(func)
            async def async_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
                decision = await astart(request, _current(overrides))
                if not isinstance(decision, Ticket):
                    return decision if decision is not None else await func(
                        request, *args, **kwargs)
                try:
                    response = await func(request, *args, **kwargs)
                except BaseException:
                    await arelease(decision)
                    raise
                return await afinish(decision, response)

            setattr(async_view, HANDLED_ATTR, True)
            return cast(V, async_view)

        @functools.wraps(func)
        def sync_view(request: HttpRequest, *args: Any, **kwargs: Any) -> Any:
            decision = start(request, _current(overrides))
            if not isinstance(decision, Ticket):
                return decision if decision is not None else func(request, *args, **kwargs)
            try:
                response = func(request, *args, **kwargs)
            except BaseException:
                release(decision)
                raise
            return finish(decision, response)

        setattr(sync_view, HANDLED_ATTR, True)
        return cast(V, sync_view)

    return decorate(view) if view is not None else decorate


def idempotent_exempt(view: V) -> V:
    """Keep :class:`IdempotencyMiddleware` away from this view."""
    setattr(view, HANDLED_ATTR, True)
    return view
