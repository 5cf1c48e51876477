"""The Redis-level store: owner checks, re-sent calls (a lost reply, sent again), TTLs, key names,
operators."""

from __future__ import annotations

import io
import json
import re

import pytest
import redis
from django.core.management import CommandError, call_command
from django.test import Client

from django_redispatterns import scripts
from django_redispatterns.exceptions import IdempotencyConflict, IdempotencyKeyReused
from django_redispatterns.idempotency import (
    Claim,
    Fingerprint,
    IdempotencyStore,
    StoredResponse,
    heartbeat,
)
from tests.redis_servers import KEY_PREFIX
from tests.urls_idempotency import idem_settings, post

FP = Fingerprint.of("POST", "/pay/", "a=1", "application/json", b'{"x": 1}')
RESPONSE = StoredResponse(201, (("Content-Type", "application/json"),), b'{"ok": true}')


@pytest.fixture
def store(redis_client: redis.Redis) -> IdempotencyStore:
    return IdempotencyStore("default")


def claim_of(store: IdempotencyStore, scope: str = "user:1", key: str = "k",
             lease: float = 5) -> Claim:
    claim = store.begin(scope, key, FP, lease=lease)
    assert isinstance(claim, Claim)
    return claim


def test_claim_complete_replay_cycle(store: IdempotencyStore, redis_client: redis.Redis) -> None:
    claim = claim_of(store)
    assert 0 < redis_client.pttl(claim.redis_key) <= 5000  # the lease
    with pytest.raises(IdempotencyConflict) as info:
        store.begin("user:1", "k", FP, lease=5)
    assert info.value.retry_after == 1 and info.value.key_hash == claim.key_hash
    assert store.complete(claim, RESPONSE, FP, ttl=86400)
    ttl = redis_client.pttl(claim.redis_key)
    assert 86_000_000 < ttl <= 86_400_000  # DIK kept records 300 s
    assert store.begin("user:1", "k", FP, lease=5) == RESPONSE


def test_mismatch_names_every_differing_part(store: IdempotencyStore) -> None:
    store.complete(claim_of(store), RESPONSE, FP, ttl=60)
    other = Fingerprint.of("PATCH", "/pay/", "a=2", "application/json", b'{"x": 2}')
    with pytest.raises(IdempotencyKeyReused) as info:
        store.begin("user:1", "k", other, lease=5)
    assert info.value.fields == ("method", "path", "body")


def test_resent_claim_is_recognised_as_ours(store: IdempotencyStore,
                                            redis_client: redis.Redis) -> None:
    # The first send applied but its reply was lost; the same call is sent again.
    claim = claim_of(store)
    heartbeat.unwatch(claim)
    again = scripts.script("idempotency_claim")(
        redis_client, [claim.redis_key], [claim.pending, claim.lease_ms])
    assert again == claim.pending  # the value holding the key: our own claim
    assert store._decide(claim, FP, again) is claim  # not a 409 to ourselves
    store.release(claim)


def test_resent_complete_is_a_no_op_success(store: IdempotencyStore) -> None:
    claim = claim_of(store)
    assert store.complete(claim, RESPONSE, FP, ttl=60)
    assert store.complete(claim, RESPONSE, FP, ttl=60)


def test_late_holder_cannot_overwrite_or_free_the_new_holder(store: IdempotencyStore,
                                                             redis_client: redis.Redis) -> None:
    old = claim_of(store, lease=5)
    heartbeat.unwatch(old)
    redis_client.delete(old.redis_key)  # its lease "ended"
    new = claim_of(store)
    assert not store.complete(old, RESPONSE, FP, ttl=60)
    assert not store.release(old)
    assert redis_client.get(new.redis_key) == new.pending
    assert store.release(new)
    assert redis_client.exists(new.redis_key) == 0


def test_extend_is_owner_checked(store: IdempotencyStore, redis_client: redis.Redis) -> None:
    claim = claim_of(store, lease=1)
    extend = scripts.script("idempotency_extend")
    assert extend(redis_client, [claim.redis_key], [claim.pending, 60_000]) == 1
    assert redis_client.pttl(claim.redis_key) > 1000
    assert extend(redis_client, [claim.redis_key], [b"P other x.y.z", 60_000]) == 0
    store.release(claim)


def test_key_names_hold_no_raw_key_or_scope(store: IdempotencyStore,
                                            redis_client: redis.Redis) -> None:
    raw_keys = ["{braces}", "a:b", "x" * 255, "alice@example.com", " spaced key "]
    for raw in raw_keys:
        store.complete(claim_of(store, "user:alice@example.com", raw), RESPONSE, FP, ttl=60)
    names = [k.decode() for k in redis_client.scan_iter(match=f"{KEY_PREFIX}:idem:*")]
    assert len(names) == len(raw_keys)
    for name in names:
        assert re.fullmatch(fr"{KEY_PREFIX}:idem:[0-9a-f]{{32}}", name)
        assert redis_client.pttl(name) > 0


@pytest.mark.django_db  # closing a response sends request_finished
def test_every_key_of_a_request_cycle_has_a_ttl(redis_client: redis.Redis) -> None:
    with idem_settings(TTL=120, LEASE=7):
        client = Client()
        held = post(client, "/stream/", key="in-flight")  # in flight until closed
        post(client, "/charge/", key="stored")
    seen = {}
    for name in redis_client.scan_iter(match=f"{KEY_PREFIX}:idem:*"):
        seen[name] = redis_client.pttl(name)
    held.close()
    assert len(seen) == 2
    assert sorted(ttl > 7000 for ttl in seen.values()) == [False, True]
    assert all(ttl > 0 for ttl in seen.values())


def test_values_are_never_pickle(store: IdempotencyStore, redis_client: redis.Redis) -> None:
    claim = claim_of(store)
    assert redis_client.get(claim.redis_key).startswith(b"P ")
    store.complete(claim, RESPONSE, FP, ttl=60)
    value = redis_client.get(claim.redis_key)
    assert value.startswith(b"D ") and not value.startswith(b"\x80")
    head, body = value.split(b"\n", 1)
    assert body == RESPONSE.body
    assert json.loads(head.split(b" ", 2)[2])["s"] == 201


def test_async_twins(store: IdempotencyStore) -> None:
    import asyncio

    async def scenario() -> object:
        claim = await store.abegin("user:2", "k", FP, lease=5)
        assert isinstance(claim, Claim)
        assert await store.acomplete(claim, RESPONSE, FP, ttl=60)
        other = await store.abegin("user:2", "k2", FP, lease=5)
        assert isinstance(other, Claim)
        assert await store.arelease(other)
        return await store.abegin("user:2", "k", FP, lease=5)

    assert asyncio.run(scenario()) == RESPONSE


# --- the operator command -----------------------------------------------------------------


def run(*args: str) -> str:
    out = io.StringIO()
    call_command("idempotency", *args, stdout=out)
    return out.getvalue()


def test_command_shows_and_deletes_a_record(store: IdempotencyStore) -> None:
    store.complete(claim_of(store, "user:42", "order-1"), RESPONSE, FP, ttl=60)
    heartbeat.unwatch(claim_of(store, "session:abc", "order-2"))  # held by "another process"
    shown = json.loads(run("show", "--scope", "user:42", "order-1", "--body"))
    assert shown["state"] == "stored" and shown["status"] == 201
    assert shown["body"] == '{"ok": true}' and 0 < shown["ttl_seconds"] <= 60
    assert json.loads(run("show", "--session", "abc", '"order-2"'))["state"] == "in_flight"
    assert run("count").strip() == "2"
    assert run("delete", "--scope", "user:42", "order-1").strip() == "deleted"
    assert run("delete", "--scope", "user:42", "order-1").strip() == "no such record"
    with pytest.raises(CommandError, match="no record"):
        run("show", "--scope", "user:42", "order-1")
    with pytest.raises(CommandError, match="invalid key"):
        run("show", "--scope", "user:42", "")
    run("delete", "--session", "abc", "order-2")


def test_command_reports_an_unreadable_record(store: IdempotencyStore,
                                              redis_client: redis.Redis) -> None:
    key, _ = IdempotencyStore.redis_key("user:9", "bad")
    redis_client.set(key, b"junk", ex=60)
    assert json.loads(run("show", "--scope", "user:9", "bad"))["state"] == "unreadable"


@pytest.mark.parametrize("reason", [None, "Créé", 'a "quoted" \\ reason'])
def test_a_record_is_the_bytes_it_always_was(reason: str | None) -> None:
    # Records outlive a deploy (TTL 24 h): the layout written and read must not drift.
    from django_redispatterns.idempotency.records import parse_value

    headers = (("Content-Type", "text/plain; charset=utf-8"), ("X-Odd", 'é "q" \\ \t\x7f'),
               ("Link", '</next>; rel="next"'))
    response = StoredResponse(299, headers, b"\xff binary\n body with a newline", reason)
    meta = json.dumps({"s": 299, "r": reason, "h": headers}, separators=(",", ":"),
                      ensure_ascii=True)
    value = response.encode(FP)
    assert value == b"D " + FP.encode().encode() + b" " + meta.encode() + b"\n" + response.body
    kind, encoded, parsed = parse_value(value)
    assert (kind, encoded, parsed) == (b"D", FP.encode().encode(), response)
