"""The fingerprint covers the query string's raw bytes, identically under WSGI and ASGI.

Django hands a view the query string decoded, and differently per handler: under WSGI as
one character per byte, under ASGI as UTF-8 text. Hashing that text as latin-1 (with
replacement) made every non-latin-1 character a ``?`` under ASGI, so ``?q=中`` and ``?q=文``
were the same request and a reused key replayed instead of answering 422.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import redis
from django.core.handlers.asgi import ASGIRequest
from django.test import AsyncClient, AsyncRequestFactory, Client, RequestFactory

from django_redispatterns.idempotency import Fingerprint
from django_redispatterns.idempotency.request import fingerprint
from tests.urls_idempotency import asgi_post, idem_settings, post, runs

NAKA, BUN = "中", "文"  # both become "?" in latin-1 with replacement


def _asgi_request(query: bytes) -> ASGIRequest:
    """An ASGI request as a server builds it: the scope's query string is raw bytes."""
    scope = {"type": "http", "method": "POST", "path": "/charge/", "query_string": query,
             "headers": [(b"content-type", b"application/json")]}
    from io import BytesIO

    return ASGIRequest(scope, BytesIO(b"{}"))


def test_one_request_one_fingerprint_under_wsgi_and_asgi() -> None:
    raw = f"q={NAKA}".encode()
    wsgi = RequestFactory().post(f"/charge/?q={NAKA}", "{}", content_type="application/json")
    asgi_client = AsyncRequestFactory().post(f"/charge/?q={NAKA}", "{}",
                                             content_type="application/json")
    asgi_server = _asgi_request(raw)
    assert fingerprint(wsgi) == fingerprint(asgi_client) == fingerprint(asgi_server)
    assert fingerprint(_asgi_request(f"q={BUN}".encode())) != fingerprint(asgi_server)
    # The percent-encoded form is other bytes on the wire: another request for the key.
    assert fingerprint(_asgi_request(b"q=%E4%B8%AD")) != fingerprint(asgi_server)


def test_fingerprint_of_takes_the_raw_query_bytes() -> None:
    one = Fingerprint.of("POST", "/p/", f"q={NAKA}".encode(), "application/json", b"{}")
    other = Fingerprint.of("POST", "/p/", f"q={BUN}".encode(), "application/json", b"{}")
    assert one.path != other.path
    assert one == Fingerprint.of("POST", "/p/", f"q={NAKA}", "application/json", b"{}")


def _reuse_statuses_wsgi() -> list[int]:
    client = Client()
    first = post(client, f"/charge/?q={NAKA}")
    again = post(client, f"/charge/?q={BUN}")
    return [first.status_code, again.status_code, *json.loads(again.content).get("mismatch", [])]


def _reuse_statuses_asgi() -> list[int]:
    async def scenario() -> list[int]:
        client = AsyncClient()
        headers = {"Idempotency-Key": "k1", "X-Test-User": "alice"}
        first = await client.post(f"/charge/?q={NAKA}", '{"amount": 100}',
                                  content_type="application/json", headers=headers)
        again = await client.post(f"/charge/?q={BUN}", '{"amount": 100}',
                                  content_type="application/json", headers=headers)
        return [first.status_code, again.status_code,
                *json.loads(again.content).get("mismatch", [])]

    return asyncio.run(scenario())


@pytest.mark.parametrize("handler", ["wsgi", "asgi"])
def test_a_key_reused_with_another_non_ascii_query_is_422(redis_client: redis.Redis,
                                                          handler: str) -> None:
    with idem_settings():
        statuses = _reuse_statuses_wsgi() if handler == "wsgi" else _reuse_statuses_asgi()
    assert statuses == [201, 422, "path"]
    assert runs(redis_client, "charge") == 1


def test_a_raw_asgi_scope_with_non_ascii_query_bytes(redis_client: redis.Redis) -> None:
    async def scenario() -> list[int | None]:
        first, _ = await asgi_post("/charge/", f"q={NAKA}".encode())
        again, _ = await asgi_post("/charge/", f"q={NAKA}".encode())
        other, body = await asgi_post("/charge/", f"q={BUN}".encode())
        assert json.loads(body)["mismatch"] == ["path"]
        return [first, again, other]

    with idem_settings():
        assert asyncio.run(scenario()) == [201, 201, 422]  # the second is the replay
    assert runs(redis_client, "charge") == 1


def test_the_same_key_replays_across_handlers(redis_client: redis.Redis) -> None:
    # One request, sent once through WSGI and retried through ASGI: the same fingerprint.
    with idem_settings():
        first = post(Client(), f"/charge/?q={NAKA}")

        async def retry() -> tuple[int | None, bytes]:
            return await asgi_post("/charge/", f"q={NAKA}".encode())

        status, body = asyncio.run(retry())
    assert first.status_code == status == 201 and body == first.content
    assert runs(redis_client, "charge") == 1
