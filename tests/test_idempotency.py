"""Idempotency keys over HTTP: every row of docs/idempotency.md's table, sync and async."""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth.models import User
from django.test import AsyncClient, Client

from django_redispatterns import signals
from django_redispatterns.exceptions import ConfigurationError, InvalidIdempotencyKey
from django_redispatterns.idempotency import parse_key
from tests.compat import aforce_login
from tests.redis_servers import KEY_PREFIX
from tests.urls_idempotency import idem_settings, post, runs


@pytest.fixture
def client(redis_client: redis.Redis) -> Iterator[Client]:
    with idem_settings():
        yield Client()


def record_keys(r: redis.Redis) -> list[bytes]:
    return list(r.scan_iter(match=f"{KEY_PREFIX}:idem:*"))


# --- first request and replay --------------------------------------------------------------


def test_first_request_runs_and_replay_is_byte_identical(client: Client,
                                                        redis_client: redis.Redis) -> None:
    first = post(client, "/charge/")
    again = post(client, "/charge/")
    assert first.status_code == again.status_code == 201  # the original status, not 409
    assert again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first
    for header in ("Content-Type", "Location", "X-Custom", "Content-Length"):
        assert again[header] == first[header]
    assert runs(redis_client, "charge") == 1


def test_set_cookie_is_never_replayed(client: Client) -> None:
    first = post(client, "/charge/")
    assert "sessionish" in first.cookies
    fresh = Client()  # another browser of the same user: the replay must not hand it a cookie
    again = post(fresh, "/charge/")
    assert again["Idempotent-Replayed"] == "true"
    assert "sessionish" not in again.cookies
    assert "Set-Cookie" not in again.serialize_headers().decode()


def test_binary_non_utf8_body_replays_byte_identical(client: Client) -> None:
    first = post(client, "/binary/")
    again = post(client, "/binary/")
    assert first.status_code == again.status_code == 202
    assert again.content == first.content and b"\xff\xfe\x00" in again.content
    assert again["Content-Type"] == "application/octet-stream"


def test_form_post_replays_and_a_changed_field_is_a_mismatch(client: Client,
                                                            redis_client: redis.Redis) -> None:
    form = "application/x-www-form-urlencoded"
    first = post(client, "/charge/", data="amount=100&card=4242", content_type=form)
    again = post(client, "/charge/", data="amount=100&card=4242", content_type=form)
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    changed = post(client, "/charge/", data="amount=999&card=4242", content_type=form)
    assert changed.status_code == 422
    assert runs(redis_client, "charge") == 1


def test_custom_reason_phrase_is_replayed(client: Client) -> None:
    first = post(client, "/charge/?status=299")
    again = post(client, "/charge/?status=299")
    assert again.status_code == 299 and again.reason_phrase == first.reason_phrase


# --- 422 mismatches ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"data": '{"amount": 101}'}, ["body"]),
        ({"content_type": "text/plain"}, ["body"]),
        ({"url": "/other/"}, ["path"]),
        ({"url": "/charge/?x=1"}, ["path"]),
        ({"method": "patch"}, ["method"]),
        ({"method": "patch", "url": "/other/", "data": "{}"}, ["method", "path", "body"]),
    ],
)
def test_same_key_different_request_is_422_naming_the_mismatch(
    client: Client, redis_client: redis.Redis, change: dict[str, Any], named: list[str]
) -> None:
    first = post(client, "/charge/")
    stored = redis_client.get(record_keys(redis_client)[0])
    url = change.pop("url", "/charge/")
    response = post(client, url, **change)
    assert response.status_code == 422
    assert response["Content-Type"] == "application/problem+json"
    body = json.loads(response.content)
    assert body["mismatch"] == named and body["code"] == "idempotency_key_reused"
    assert redis_client.get(record_keys(redis_client)[0]) == stored  # record untouched
    assert runs(redis_client, "charge") == 1
    assert post(client, "/charge/").content == first.content  # the original still replays


# --- 400s ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    ["", "   ", "x" * 256, '"' + "x" * 256 + '"', "a\tb", "a\x00b", "a\x7fb", "é", '"abc',
     '"a"b', '"a\\b"', "a, b", '"a", "b"', '""'],
)
def test_malformed_key_is_400_and_nothing_runs(client: Client, redis_client: redis.Redis,
                                               raw: str) -> None:
    response = post(client, "/charge/", key=raw)
    assert response.status_code == 400
    body = json.loads(response.content)
    assert body["code"] == "idempotency_key_invalid"
    assert raw.strip() not in body["detail"] or not raw.strip()  # the key is never echoed
    assert runs(redis_client, "charge:start") == 0
    assert record_keys(redis_client) == []


def test_header_injection_attempt_is_rejected(client: Client, redis_client: redis.Redis) -> None:
    response = post(client, "/charge/", key="x\r\nSet-Cookie: a=b")
    assert response.status_code == 400
    assert "a=b" not in response.serialize_headers().decode()


@pytest.mark.parametrize(("raw", "key"), [
    ("abc", "abc"), ('"abc"', "abc"), (' "a\\"b" ', 'a"b'), ('"a\\\\b"', "a\\b"),
    ("x" * 255, "x" * 255), ("a b", "a b"), ("550e8400-e29b-41d4-a716-446655440000",
                                             "550e8400-e29b-41d4-a716-446655440000"),
])
def test_accepted_key_forms(raw: str, key: str) -> None:
    assert parse_key(raw) == key


def test_parse_key_raises_the_documented_exception() -> None:
    with pytest.raises(InvalidIdempotencyKey, match="empty"):
        parse_key("")


def test_quoted_and_bare_forms_are_the_same_key(client: Client, redis_client: redis.Redis) -> None:
    first = post(client, "/charge/", key="order-7")
    again = post(client, "/charge/", key='"order-7"')
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"


def test_required_and_missing_is_400(redis_client: redis.Redis) -> None:
    with idem_settings(REQUIRED=True):
        response = post(Client(), "/charge/", key=None)
    assert response.status_code == 400
    assert json.loads(response.content)["code"] == "idempotency_key_missing"
    assert runs(redis_client, "charge:start") == 0


def test_optional_and_missing_runs_normally_and_stores_nothing(
    client: Client, redis_client: redis.Redis
) -> None:
    assert post(client, "/charge/", key=None).status_code == 201
    assert post(client, "/charge/", key=None).status_code == 201
    assert runs(redis_client, "charge") == 2
    assert record_keys(redis_client) == []


@pytest.mark.parametrize("method", ["get", "head", "options", "delete", "put"])
def test_methods_outside_the_setting_are_not_covered(client: Client, redis_client: redis.Redis,
                                                     method: str) -> None:
    headers = {"Idempotency-Key": "k1", "X-Test-User": "alice"}
    for _ in range(2):
        getattr(client, method)("/charge/", headers=headers)
    assert runs(redis_client, "charge") == 2
    assert record_keys(redis_client) == []


def test_methods_setting_is_honoured(redis_client: redis.Redis) -> None:
    with idem_settings(METHODS=["PUT"]):
        client = Client()
        post(client, "/charge/", method="put")
        again = post(client, "/charge/", method="put")
        post(client, "/charge/")
    assert again["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "charge") == 2  # one PUT, one uncovered POST


# --- failures free the key -------------------------------------------------------------------


@pytest.mark.parametrize("query", ["?status=500", "?status=503", "?status=429"])
def test_5xx_and_429_are_not_stored_and_the_retry_runs(client: Client, redis_client: redis.Redis,
                                                       query: str) -> None:
    assert post(client, "/charge/" + query).status_code == int(query[-3:])
    assert record_keys(redis_client) == []
    assert post(client, "/charge/" + query).get("Idempotent-Replayed") is None
    assert runs(redis_client, "charge") == 2


@pytest.mark.parametrize("status", [200, 400, 404, 409])
def test_other_statuses_below_500_are_stored(client: Client, redis_client: redis.Redis,
                                             status: int) -> None:
    post(client, f"/charge/?status={status}")
    again = post(client, f"/charge/?status={status}")
    assert again.status_code == status and again["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "charge") == 1


def test_view_exception_frees_the_key(redis_client: redis.Redis) -> None:
    with idem_settings():
        client = Client(raise_request_exception=False)
        assert post(client, "/charge/?raise=1").status_code == 500
        assert record_keys(redis_client) == []
        assert post(client, "/charge/?raise=1").status_code == 500
    assert runs(redis_client, "charge") == 2


def test_view_exception_frees_the_key_when_the_test_client_reraises(
    client: Client, redis_client: redis.Redis
) -> None:
    for _ in range(2):
        with pytest.raises(RuntimeError):
            post(client, "/charge/?raise=1")
    assert record_keys(redis_client) == []


# --- streaming and size limit ---------------------------------------------------------------


@pytest.mark.django_db  # closing a response sends request_finished
def test_streaming_passes_through_unstored(client: Client, redis_client: redis.Redis) -> None:
    first = post(client, "/stream/")
    assert first.streaming
    body = b"".join(first.streaming_content)
    first.close()  # the server closes the response: the key is freed
    assert record_keys(redis_client) == []
    again = post(client, "/stream/")
    assert again.get("Idempotent-Replayed") is None and body.startswith(b"ab")
    again.close()
    assert runs(redis_client, "stream") == 2


@pytest.mark.django_db  # closing a response sends request_finished
def test_streaming_holds_the_claim_until_closed(client: Client, redis_client: redis.Redis) -> None:
    first = post(client, "/stream/")
    assert post(client, "/stream/").status_code == 409  # still being sent
    first.close()
    assert record_keys(redis_client) == []


def test_oversized_body_passes_through_unstored_with_a_log_line(
    redis_client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    with idem_settings(MAX_BODY_BYTES=1000), caplog.at_level(
            logging.WARNING, "django_redispatterns.idempotency"):
        client = Client()
        assert len(post(client, "/big/?n=1001").content) == 1001
        assert "MAX_BODY_BYTES" in caplog.text
        assert record_keys(redis_client) == []
        post(client, "/big/?n=1001")
        post(client, "/big/?n=1000")
        again = post(client, "/big/?n=1000")
    assert again["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "big") == 3


# --- scope ------------------------------------------------------------------------------------


def test_one_callers_key_never_replays_anothers_response(client: Client,
                                                        redis_client: redis.Redis) -> None:
    alice = post(client, "/charge/", user="alice")
    bob = post(client, "/charge/", user="bob")
    assert bob.get("Idempotent-Replayed") is None and bob.content != alice.content
    assert runs(redis_client, "charge") == 2
    assert len(record_keys(redis_client)) == 2


def test_low_entropy_keys_stay_per_caller(client: Client, redis_client: redis.Redis) -> None:
    for key in map(str, range(1, 6)):
        post(client, "/charge/", key=key, user="alice")
    for key in map(str, range(1, 6)):
        assert post(client, "/charge/", key=key, user="mallory").get("Idempotent-Replayed") is None
    assert runs(redis_client, "charge") == 10


@pytest.mark.django_db
def test_default_scope_is_the_user_then_the_session(redis_client: redis.Redis) -> None:
    alice = User.objects.create_user("alice@example.com", password="x")
    bob = User.objects.create_user("bob@example.com", password="x")
    with idem_settings(SCOPE=None):
        a1, a2, b = Client(), Client(), Client()
        a1.force_login(alice)
        a2.force_login(alice)  # another device of the same user: same scope
        b.force_login(bob)
        first = post(a1, "/charge/", user=None)
        assert post(a2, "/charge/", user=None).content == first.content
        assert post(b, "/charge/", user=None).get("Idempotent-Replayed") is None

        anon = Client()
        assert post(anon, "/charge/", user=None).status_code == 400  # no session, no scope
        session = anon.session
        session["cart"] = 1
        session.save()
        anon.cookies["sessionid"] = session.session_key
        first_anon = post(anon, "/charge/", user=None)
        assert first_anon.status_code == 201
        assert post(anon, "/charge/", user=None).content == first_anon.content
    names = b" ".join(record_keys(redis_client))
    assert b"alice" not in names and b"example" not in names and b"user" not in names


def test_no_scope_is_400_naming_the_problem(client: Client, redis_client: redis.Redis) -> None:
    response = post(client, "/charge/", user=None)
    assert response.status_code == 400
    assert json.loads(response.content)["code"] == "idempotency_scope_missing"
    assert runs(redis_client, "charge:start") == 0


def test_bad_scope_setting_is_a_configuration_error(redis_client: redis.Redis) -> None:
    with idem_settings(SCOPE="tests.nope.scope"), pytest.raises(ConfigurationError, match="SCOPE"):
        post(Client(), "/charge/")


# --- decorator -----------------------------------------------------------------------------------


def test_decorator_overrides_required_ttl_and_methods(client: Client,
                                                      redis_client: redis.Redis) -> None:
    assert post(client, "/decorated/", key=None).status_code == 400  # required=True
    post(client, "/decorated/", method="put")
    assert post(client, "/decorated/", method="put")["Idempotent-Replayed"] == "true"
    [key] = record_keys(redis_client)
    assert 0 < redis_client.pttl(key) <= 7000  # ttl=7
    assert runs(redis_client, "charge") == 1  # the middleware did not handle it a second time


def test_decorator_works_without_the_middleware(redis_client: redis.Redis) -> None:
    from django.test import override_settings

    from tests import settings as base

    with idem_settings(), override_settings(MIDDLEWARE=base.MIDDLEWARE):
        client = Client()
        first = post(client, "/decorated/")
        assert post(client, "/decorated/").content == first.content
    assert runs(redis_client, "charge") == 1


def test_decorated_template_response_is_stored_after_rendering(client: Client,
                                                               redis_client: redis.Redis) -> None:
    first = post(client, "/templated/")
    again = post(client, "/templated/")
    assert first.status_code == 201 and first.content.startswith(b"rendered ")
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert runs(redis_client, "templated") == 1


def test_exempt_view_is_left_alone(client: Client, redis_client: redis.Redis) -> None:
    post(client, "/exempt/")
    post(client, "/exempt/")
    assert runs(redis_client, "exempt") == 2
    assert record_keys(redis_client) == []


# --- async (ASGI) -----------------------------------------------------------------------------


def _apost(client: AsyncClient, url: str, key: str = "k1", user: str = "alice",
           data: str = '{"amount": 100}') -> Any:
    return client.post(url, data, content_type="application/json",
                       headers={"Idempotency-Key": key, "X-Test-User": user})


@pytest.mark.parametrize("url", ["/acharge/", "/charge/", "/adecorated/"])
def test_async_stack_stores_and_replays(redis_client: redis.Redis, url: str) -> None:
    async def scenario() -> list[Any]:
        client = AsyncClient()
        first = await _apost(client, url)
        again = await _apost(client, url)
        other = await _apost(client, url, data='{"amount": 1}')
        busy = await asyncio.gather(*[_apost(client, url + "?sleep=1", key="k2")
                                      for _ in range(4)])
        return [first, again, other, busy]

    with idem_settings():
        first, again, other, busy = asyncio.run(scenario())
    assert first.status_code == 201 and again.content == first.content
    assert again["Idempotent-Replayed"] == "true"
    assert other.status_code == 422
    ran = [r for r in busy if r.status_code == 201 and "Idempotent-Replayed" not in r]
    assert len(ran) == 1  # the rest: 409 while it ran (or the replay, on a very busy box)
    assert all(r.status_code == 409 or r["Idempotent-Replayed"] == "true"
               for r in busy if r is not ran[0])
    name = "acharge" if url != "/charge/" else "charge"
    assert runs(redis_client, name) == 2


def test_async_view_exception_frees_the_key(redis_client: redis.Redis) -> None:
    async def scenario() -> list[int]:
        client = AsyncClient(raise_request_exception=False)
        return [(await _apost(client, "/acharge/?raise=1")).status_code for _ in range(2)]

    with idem_settings():
        assert asyncio.run(scenario()) == [500, 500]
    assert runs(redis_client, "acharge") == 2
    assert record_keys(redis_client) == []


@pytest.mark.django_db(transaction=True)
def test_async_default_scope_uses_auser(redis_client: redis.Redis) -> None:
    user = User.objects.create_user("carol", password="x")

    async def scenario() -> tuple[Any, Any]:
        client = AsyncClient()
        await aforce_login(client, user)
        first = await client.post("/acharge/", "{}", content_type="application/json",
                                  headers={"Idempotency-Key": "k"})
        again = await client.post("/acharge/", "{}", content_type="application/json",
                                  headers={"Idempotency-Key": "k"})
        return first, again

    with idem_settings(SCOPE=None):
        first, again = asyncio.run(scenario())
    assert first.status_code == 201 and again["Idempotent-Replayed"] == "true"


# --- signals -----------------------------------------------------------------------------------


@pytest.mark.django_db  # closing a response sends request_finished
def test_signals_for_replay_conflict_and_mismatch(client: Client) -> None:
    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(name: str) -> Any:
        def receive(sender: Any, **kwargs: Any) -> None:
            seen.append((name, kwargs))
        return receive

    handlers = {n: receiver(n) for n in ("replayed", "conflict", "mismatch")}
    signals.idempotent_replayed.connect(handlers["replayed"])
    signals.idempotency_conflict.connect(handlers["conflict"])
    signals.idempotency_mismatch.connect(handlers["mismatch"])
    try:
        held = post(client, "/stream/")  # holds the claim until closed
        post(client, "/stream/")
        held.close()
        post(client, "/charge/", key="k2")
        post(client, "/charge/", key="k2")
        post(client, "/charge/", key="k2", data="{}")
    finally:
        signals.idempotent_replayed.disconnect(handlers["replayed"])
        signals.idempotency_conflict.disconnect(handlers["conflict"])
        signals.idempotency_mismatch.disconnect(handlers["mismatch"])
    assert [name for name, _ in seen] == ["conflict", "replayed", "mismatch"]
    hashes = {kw["key_hash"] for _, kw in seen}
    assert all(len(h) == 32 for h in hashes) and len(hashes) == 2
    assert seen[2][1]["fields"] == ("body",)
    assert all("request" in kw for _, kw in seen)


# --- forms behind CSRF, multipart, settings validation ----------------------------------------


def test_multipart_form_behind_csrf_replays_even_with_a_new_boundary(
    redis_client: redis.Redis,
) -> None:
    from django.core.files.uploadedfile import SimpleUploadedFile
    from django.test import override_settings
    from django.test.client import encode_multipart

    from tests import settings as base

    secret = "a" * 32
    middleware = [*base.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware",
                  "django_redispatterns.middleware.IdempotencyMiddleware"]

    def send(boundary: str, amount: str = "100") -> Any:
        client = Client(enforce_csrf_checks=True)  # CSRF reads request.POST before us
        client.cookies["csrftoken"] = secret
        upload = SimpleUploadedFile("receipt.bin", b"\x00\xffbytes")
        data = {"amount": amount, "csrfmiddlewaretoken": secret, "receipt": upload}
        return client.post("/charge/", encode_multipart(boundary, data),
                           content_type=f"multipart/form-data; boundary={boundary}",
                           headers={"Idempotency-Key": "form-1", "X-Test-User": "alice",
                                    "Referer": "http://testserver/"})

    with idem_settings(), override_settings(MIDDLEWARE=middleware):
        first = send("BoundaryOne")
        again = send("BoundaryTwo")  # a browser re-submit picks a new boundary
        changed = send("BoundaryThree", amount="999")
    assert first.status_code == 201, first.content
    assert again["Idempotent-Replayed"] == "true" and again.content == first.content
    assert changed.status_code == 422
    assert runs(redis_client, "charge") == 1


@pytest.mark.parametrize(("section", "named"), [
    ({"METHODS": ["POST", 1]}, "METHODS"),
    ({"METHODS": ["PO ST"]}, "METHODS"),
    ({"HEADER": "Idem Key"}, "HEADER"),
    ({"MAX_BODY_BYTES": -1}, "MAX_BODY_BYTES"),
])
def test_bad_idempotency_settings_name_the_key(redis_client: redis.Redis,
                                               section: dict[str, Any], named: str) -> None:
    with idem_settings(**section), pytest.raises(ConfigurationError, match=named):
        post(Client(), "/charge/")


def test_decorator_rejects_a_non_positive_ttl() -> None:
    from django_redispatterns.idempotency.options import options

    with pytest.raises(ConfigurationError, match="ttl"):
        options(ttl=0)
    from django_redispatterns.idempotency import idempotent

    with pytest.raises(ConfigurationError, match="lease"):  # at import time, not per request
        idempotent(lease=-1)


def test_custom_header_name(redis_client: redis.Redis) -> None:
    with idem_settings(HEADER="X-Request-Id"):
        client = Client()
        headers = {"X-Request-Id": "r1", "X-Test-User": "alice"}
        client.post("/charge/", "{}", content_type="application/json", headers=headers)
        again = client.post("/charge/", "{}", content_type="application/json", headers=headers)
    assert again["Idempotent-Replayed"] == "true"


def test_default_ttl_is_a_day_not_300_seconds(client: Client, redis_client: redis.Redis) -> None:
    # DIK stored records with the cache default (300 s here).
    post(client, "/charge/")
    [key] = record_keys(redis_client)
    assert 86_000_000 < redis_client.pttl(key) <= 86_400_000


def test_raw_keys_never_reach_the_logs(client: Client, redis_client: redis.Redis,
                                       caplog: pytest.LogCaptureFixture) -> None:
    secret = "raw-key-4f9c2e"
    with caplog.at_level(logging.DEBUG, "django_redispatterns"):
        held = threading.Thread(target=lambda: post(Client(), "/charge/?sleep=1.5", key=secret))
        held.start()
        deadline = time.monotonic() + 15
        while runs(redis_client, "charge:start") == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert post(client, "/charge/?sleep=1.5", key=secret).status_code == 409
        held.join(30)
        assert post(client, "/charge/?sleep=1.5", key=secret, data="{}").status_code == 422
    assert "conflict" in caplog.text and "reused" in caplog.text
    assert secret not in caplog.text and "alice" not in caplog.text


def test_body_over_djangos_upload_limit_is_400_and_takes_no_claim(
    client: Client, redis_client: redis.Redis
) -> None:
    from django.test import override_settings

    with override_settings(DATA_UPLOAD_MAX_MEMORY_SIZE=1000):
        response = post(client, "/charge/", data='{"pad": "' + "x" * 2000 + '"}')
    assert response.status_code == 400  # Django's RequestDataTooBig, as the view would get
    assert record_keys(redis_client) == []
    assert runs(redis_client, "charge:start") == 0


def test_csrf_refusal_before_us_takes_no_claim(redis_client: redis.Redis) -> None:
    from django.test import override_settings

    from tests import settings as base

    middleware = [*base.MIDDLEWARE, "django.middleware.csrf.CsrfViewMiddleware",
                  "django_redispatterns.middleware.IdempotencyMiddleware"]
    with idem_settings(), override_settings(MIDDLEWARE=middleware):
        client = Client(enforce_csrf_checks=True)
        refused = post(client, "/charge/", headers={"Referer": "http://testserver/"})
        assert refused.status_code == 403
        assert record_keys(redis_client) == []
        client.cookies["csrftoken"] = "b" * 32
        accepted = post(client, "/charge/", headers={"X-CSRFToken": "b" * 32})
    assert accepted.status_code == 201 and accepted.get("Idempotent-Replayed") is None
    assert runs(redis_client, "charge") == 1


def test_drf_view_with_drf_only_auth_via_the_decorator(redis_client: redis.Redis) -> None:
    def send(user: str, body: str = '{"amount": 5}') -> Any:
        return Client().post("/drf/", body, content_type="application/json",
                             headers={"Idempotency-Key": "drf-1", "X-Api-User": user})

    with idem_settings(SCOPE=None):  # the default scope: DRF's request.user
        first = send("42")
        again = send("42")
        other_user = send("43")
        changed = send("42", '{"amount": 6}')
        anonymous = Client().post("/drf/", "{}", content_type="application/json",
                                  headers={"Idempotency-Key": "drf-1"})
    assert first.status_code == 201 and json.loads(first.content)["got"] == {"amount": 5}
    assert again.content == first.content and again["Idempotent-Replayed"] == "true"
    assert other_user.get("Idempotent-Replayed") is None
    assert json.loads(other_user.content)["user"] == "43"
    assert changed.status_code == 422
    assert anonymous.status_code == 400
    assert runs(redis_client, "drf") == 2
