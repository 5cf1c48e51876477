"""What a request brings: its idempotency key, whom the key belongs to, and its fingerprint."""

from __future__ import annotations

from collections.abc import Iterator

from django.http import HttpRequest
from django.http.request import RawPostDataException

from ..exceptions import InvalidIdempotencyKey
from .records import Fingerprint

MAX_KEY_LENGTH = 255


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
    if not (key.isascii() and key.isprintable()):  # " " to "~"
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
    """Method, path + the query string's raw bytes, content type + body of ``request``.

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
    return Fingerprint.of(request.method or "", request.path, raw_query(request), content_type,
                          body)


def raw_query(request: HttpRequest) -> bytes:
    """The query string's bytes as the client sent them, the same under WSGI and ASGI.

    Django decodes it per handler: WSGI gives one character per byte (latin-1, as PEP 3333
    says), ASGI gives UTF-8 text; the ASGI scope still holds the bytes.
    """
    scope = getattr(request, "scope", None)
    if scope is not None:
        query = scope.get("query_string", b"")
        # Django's AsyncClient puts text here; a server puts bytes.
        return query if isinstance(query, bytes) else query.encode("utf-8", "surrogateescape")
    text = request.META.get("QUERY_STRING", "")
    try:
        return text.encode("latin-1")
    except UnicodeEncodeError:  # not from a WSGI server (a hand-built request): plain text
        return text.encode("utf-8", "surrogateescape")


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
