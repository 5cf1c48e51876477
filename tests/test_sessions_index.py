"""The per-user index through real requests: login, logout, password change, revocation.

Every scenario drives Django's own ``SessionMiddleware`` and ``django.contrib.auth`` with
several test clients (one per "device") against the real test Redis.
"""

from __future__ import annotations

import multiprocessing
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from django.contrib.auth import SESSION_KEY, get_user_model
from django.contrib.auth.models import AbstractBaseUser
from django.core.management import call_command
from django.core.management.base import CommandError
from django.test import Client, override_settings

from django_redispatterns import scripts, signals
from django_redispatterns.sessions import (
    SessionStore,
    logout_everywhere,
    revoke_session,
    session_handle,
    user_sessions,
    user_tag,
)
from tests.compat import requires_django_5
from tests.redis_servers import KEY_PREFIX
from tests.test_sessions_workers import create_sessions

MIDDLEWARE = [
    "django_redispatterns.middleware.SessionActivityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
]
# The middleware also works right after SessionMiddleware (it then saves the session itself).
INNER_MIDDLEWARE = [MIDDLEWARE[1], MIDDLEWARE[0], MIDDLEWARE[2]]

pytestmark = [
    pytest.mark.django_db,
    pytest.mark.usefixtures("redis_client"),
    pytest.mark.urls("tests.urls_sessions"),
]


@pytest.fixture(autouse=True)
def _engine() -> Iterator[None]:
    with override_settings(SESSION_ENGINE="django_redispatterns.sessions", MIDDLEWARE=MIDDLEWARE):
        yield


def make_user(name: str = "alice", password: str = "pw-alice") -> Any:
    return get_user_model().objects.create_user(username=name, password=password)


def device(name: str = "alice", password: str = "pw-alice", agent: str = "agent") -> Client:
    client = Client(HTTP_USER_AGENT=agent, REMOTE_ADDR="203.0.113.77")
    response = client.post("/login/", {"username": name, "password": password})
    assert response.status_code == 200, response.content
    return client


def cookie(client: Client) -> str:
    return client.cookies["sessionid"].value


def whoami(client: Client) -> Any:
    response = client.get("/whoami/")
    assert response.status_code == 200
    return response.json()["user"]


def index_key(user: Any) -> str:
    return f"{KEY_PREFIX}:sess:{{{user_tag(str(user.pk))}}}:u"


def indexed(redis_client: redis.Redis, user: Any) -> set[str]:
    return {m.decode() for m, _ in redis_client.zscan_iter(index_key(user))}


def live_data_keys(redis_client: redis.Redis, user: Any) -> set[str]:
    """sids of the user's sessions that hold data (SCAN over the user's tag)."""
    pattern = f"{KEY_PREFIX}:sess:\\{{{user_tag(str(user.pk))}\\}}:s:*"
    return {k.decode().rsplit(":", 1)[1] for k in redis_client.scan_iter(match=pattern, count=1000)
            if redis_client.hexists(k, "d")}


def assert_index_exact(redis_client: redis.Redis, user: Any) -> None:
    """Invariant I8: the index holds exactly the live sessions, and outlives each of them."""
    assert indexed(redis_client, user) == live_data_keys(redis_client, user)
    members = indexed(redis_client, user)
    if members:
        tag = user_tag(str(user.pk))
        longest = max(redis_client.pttl(f"{KEY_PREFIX}:sess:{{{tag}}}:s:{sid}") for sid in members)
        assert redis_client.pttl(index_key(user)) >= longest - 5


# --- login, logout, rotation ----------------------------------------------------------


def test_each_login_is_indexed_and_listed(redis_client: redis.Redis) -> None:
    user = make_user()
    devices = [device(agent=f"device-{i}") for i in range(3)]
    assert [whoami(d) for d in devices] == ["alice"] * 3
    sessions = user_sessions(user, current=cookie(devices[0]))
    assert len(sessions) == 3
    assert {s.user_agent for s in sessions} == {"device-0", "device-1", "device-2"}
    assert {s.ip for s in sessions} == {"203.0.113.0/24"}
    assert [s.is_current for s in sessions].count(True) == 1
    assert all(s.created and s.last_activity and s.expires for s in sessions)
    assert {s.session_key for s in sessions} == {session_handle(cookie(d)) for d in devices}
    assert_index_exact(redis_client, user)


def test_login_rotates_the_key_keeps_data_and_indexes_only_the_new_key(
    redis_client: redis.Redis,
) -> None:
    user = make_user()
    client = Client()
    client.get("/write/cart-42/")
    anonymous_key = cookie(client)
    client.post("/login/", {"username": "alice", "password": "pw-alice"})
    signed_in_key = cookie(client)
    assert signed_in_key != anonymous_key
    assert signed_in_key.startswith(user_tag(str(user.pk)))
    assert SessionStore().exists(anonymous_key) is False
    assert client.get("/whoami/").json() == {"user": "alice", "data": "cart-42"}
    assert indexed(redis_client, user) == {session_handle(signed_in_key)}
    assert_index_exact(redis_client, user)


def test_switching_user_moves_the_session_to_the_new_users_index(
    redis_client: redis.Redis,
) -> None:
    alice, bob = make_user(), make_user("bob", "pw-bob")
    client = device()
    alice_key = cookie(client)
    client.post("/login/", {"username": "bob", "password": "pw-bob"})
    assert whoami(client) == "bob"
    assert indexed(redis_client, alice) == set()
    assert indexed(redis_client, bob) == {session_handle(cookie(client))}
    assert SessionStore().exists(alice_key) is False


def test_logout_deletes_the_session_and_its_index_entry(redis_client: redis.Redis) -> None:
    user = make_user()
    keep, leave = device(), device()
    old_cookie = cookie(leave)
    response = leave.get("/logout/")
    assert response.cookies["sessionid"].value == ""  # Django deletes the cookie
    assert indexed(redis_client, user) == {session_handle(cookie(keep))}
    replay = Client()
    replay.cookies["sessionid"] = old_cookie
    assert whoami(replay) is None
    assert SessionStore().exists(old_cookie) is False
    assert_index_exact(redis_client, user)


def test_manual_user_change_without_login_is_reindexed(redis_client: redis.Redis) -> None:
    """A session that gains a user id outside login() still lands in the right index."""
    user = make_user()
    store = SessionStore()
    store["x"] = 1
    store.save()
    first = store.session_key
    store[SESSION_KEY] = str(user.pk)
    store.save()
    assert store.session_key != first and SessionStore().exists(first) is False
    assert indexed(redis_client, user) == {session_handle(store.session_key or "")}
    del store[SESSION_KEY]
    store.save()  # no user any more: out of the index, data kept
    assert indexed(redis_client, user) == set()
    assert SessionStore(store.session_key).load() == {"x": 1}
    store.delete()


def test_a_move_racing_a_revocation_does_not_resurrect(redis_client: redis.Redis) -> None:
    user = make_user()
    store = SessionStore()
    store["x"] = 1
    store.save()
    SessionStore().delete(store.session_key)  # revoked by someone else meanwhile
    store[SESSION_KEY] = str(user.pk)
    from django.contrib.sessions.backends.base import UpdateError

    with pytest.raises(UpdateError):
        store.save()
    assert indexed(redis_client, user) == set()
    assert live_data_keys(redis_client, user) == set()


# --- expiry keeps the index exact -------------------------------------------------------


def test_expiry_changes_follow_into_the_index(redis_client: redis.Redis) -> None:
    user = make_user()
    long_lived, short_lived = SessionStore(), SessionStore()
    for store, age in ((long_lived, 3000), (short_lived, 100)):
        store[SESSION_KEY] = str(user.pk)
        store.set_expiry(age)
        store.save()
    # the index outlives its longest member by the 60 s slack of its scores, no more
    assert 3000_000 - 5000 <= redis_client.pttl(index_key(user)) <= 3060_000
    long_lived.set_expiry(200)
    long_lived.save()
    assert 200_000 - 5000 <= redis_client.pttl(index_key(user)) <= 260_000
    assert_index_exact(redis_client, user)
    from datetime import timedelta

    long_lived.set_expiry(-timedelta(seconds=1))  # expired: gone at once, index too
    long_lived.save()
    assert indexed(redis_client, user) == {session_handle(short_lived.session_key or "")}
    assert_index_exact(redis_client, user)


def test_sessions_gone_behind_the_index_are_pruned_when_listed(redis_client: redis.Redis) -> None:
    user = make_user()
    a, b = device(), device()
    tag = user_tag(str(user.pk))
    redis_client.delete(f"{KEY_PREFIX}:sess:{{{tag}}}:s:{session_handle(cookie(a))}")  # evicted
    assert [s.session_key for s in user_sessions(user)] == [session_handle(cookie(b))]
    assert indexed(redis_client, user) == {session_handle(cookie(b))}


# --- logout everywhere ------------------------------------------------------------------


def test_logout_everywhere_keeps_only_the_current_session(redis_client: redis.Redis) -> None:
    alice, bob = make_user(), make_user("bob", "pw-bob")
    alice_devices = [device() for _ in range(5)]
    bob_devices = [device("bob", "pw-bob") for _ in range(3)]
    events: list[dict[str, Any]] = []

    def on_revoked(sender: Any, **kwargs: Any) -> None:
        events.append(kwargs)

    signals.sessions_revoked.connect(on_revoked)
    try:
        response = alice_devices[0].post("/everywhere-else/")
    finally:
        signals.sessions_revoked.disconnect(on_revoked)
    assert response.json() == {"revoked": 4}
    assert events == [{"signal": signals.sessions_revoked, "user_id": str(alice.pk), "count": 4,
                       "kept": session_handle(cookie(alice_devices[0]))}]
    assert [whoami(d) for d in alice_devices] == ["alice"] + [None] * 4
    assert [whoami(d) for d in bob_devices] == ["bob"] * 3
    assert len(user_sessions(bob)) == 3
    assert_index_exact(redis_client, alice)
    assert logout_everywhere(alice, keep=cookie(alice_devices[0])) == 0  # idempotent


def test_revoke_one_session_by_handle_only_for_its_owner(redis_client: redis.Redis) -> None:
    alice, bob = make_user(), make_user("bob", "pw-bob")
    alice_device, bob_device = device(), device("bob", "pw-bob")
    bob_handle = user_sessions(bob)[0].session_key
    assert revoke_session(alice, bob_handle) is False  # not hers: untouched
    assert whoami(bob_device) == "bob"
    assert revoke_session(alice, user_sessions(alice)[0].session_key) is True
    assert whoami(alice_device) is None
    assert revoke_session(alice, "0" * 32) is False


def test_ten_thousand_sessions_are_revoked_in_batches(own_redis: redis.Redis) -> None:
    user = make_user()
    tag = user_tag(str(user.pk))
    encoded = SessionStore().encode({SESSION_KEY: str(user.pk)})
    save = scripts.script("session_save")
    sids = [f"{i:032x}" for i in range(10_000)]
    for start in range(0, len(sids), 1000):
        calls: list[scripts.Call] = [
            (save, [f"{KEY_PREFIX}:sess:{{{tag}}}:s:{sid}", f"{KEY_PREFIX}:sess:{{{tag}}}:u"],
             ["c1", encoded, 600_000, 0, f"n{sid}"])
            for sid in sids[start:start + 1000]
        ]
        assert scripts.run_many(own_redis, calls) == [1] * 1000
    assert own_redis.zcard(index_key(user)) == 10_000
    from django.conf import settings

    # A cap above the 10,000, so the keeper's sign-in ends none of them (test_sessions_cap).
    sessions_settings = {**settings.REDIS_PATTERNS.get("SESSIONS", {}), "MAX_PER_USER": 20_000}
    with override_settings(REDIS_PATTERNS={**settings.REDIS_PATTERNS,
                                           "SESSIONS": sessions_settings}):
        keeper = SessionStore()
        keeper[SESSION_KEY] = str(user.pk)
        keeper.save()
    own_redis.slowlog_reset()
    own_redis.config_resetstat()
    started = time.monotonic()
    assert logout_everywhere(user, keep=keeper.session_key) == 10_000
    elapsed = time.monotonic() - started
    assert elapsed < 60, elapsed
    # batched: many bounded script calls (10,000 sessions in batches of at most a few
    # hundred), not one call that blocks the server for all of them
    scripts_run = sum(
        stats["calls"] for name, stats in own_redis.info("commandstats").items()
        if name in ("cmdstat_evalsha", "cmdstat_eval")
    )
    assert scripts_run >= 10, scripts_run
    assert indexed(own_redis, user) == {session_handle(keeper.session_key or "")}
    assert live_data_keys(own_redis, user) == indexed(own_redis, user)
    # and no single call came near a second of server time, even on a loaded machine
    slow = own_redis.slowlog_get(128)
    assert all(e["duration"] < 1_000_000 for e in slow), slow  # microseconds


# --- password change ---------------------------------------------------------------------


@pytest.mark.parametrize("eager", [True, False])
def test_password_change_keeps_this_device_and_ends_the_others(
    redis_client: redis.Redis, eager: bool
) -> None:
    user = make_user()
    devices = [device() for _ in range(3)]
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                                           "SESSIONS": {"LOGOUT_ON_PASSWORD_CHANGE": eager}}):
        response = devices[0].post("/password/", {"password": "new-pw"})
        assert response.status_code == 200
        # eager: deleted from Redis at once; lazy: still stored until Django's hash check
        assert len(indexed(redis_client, user)) == (1 if eager else 3)
        assert [whoami(d) for d in devices] == ["alice", None, None]
        assert_index_exact(redis_client, user)


def test_password_change_outside_a_request_revokes_everything(redis_client: redis.Redis) -> None:
    user = make_user()
    devices = [device() for _ in range(2)]
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                                           "SESSIONS": {"LOGOUT_ON_PASSWORD_CHANGE": True}}):
        fresh: AbstractBaseUser = get_user_model().objects.get(pk=user.pk)
        fresh.set_password("reset-by-email")
        fresh.save()
    assert indexed(redis_client, user) == set()
    assert [whoami(d) for d in devices] == [None, None]


# --- no resurrection, no fixation, hostile cookies ----------------------------------------


def test_a_request_saving_after_a_concurrent_revocation_gets_400(
    redis_client: redis.Redis,
) -> None:
    user = make_user()
    client = device()
    response = client.get("/revoked-while-running/")
    assert response.status_code == 400  # Django's SessionInterrupted
    assert indexed(redis_client, user) == set()
    assert live_data_keys(redis_client, user) == set()
    assert whoami(client) is None


def test_a_client_chosen_session_key_is_never_adopted(redis_client: redis.Redis) -> None:
    make_user()
    client = Client()
    chosen = "attackerchosen123"
    client.cookies["sessionid"] = chosen
    client.post("/login/", {"username": "alice", "password": "pw-alice"})
    assert cookie(client) != chosen
    well_formed = "a" * 64  # our format, but never issued
    other = Client()
    other.cookies["sessionid"] = well_formed
    other.get("/write/x/")
    assert cookie(other) != well_formed
    for key in redis_client.scan_iter(match=f"{KEY_PREFIX}:*"):
        assert b"attackerchosen123" not in key and b"a" * 32 not in key


@pytest.mark.parametrize("value", ["x" * 4096, "héllo-wörld-1234", "{}{}{}{}", "a b c d e f",
                                   "../../etc/passwd", "lock:job:1234",
                                   pytest.param(f"{KEY_PREFIX}:sess:{{x}}:u", id="a-key-name")])
def test_hostile_cookies_are_treated_as_unknown(redis_client: redis.Redis, value: str) -> None:
    client = Client()
    client.cookies["sessionid"] = value
    assert client.get("/whoami/").status_code == 200
    response = client.get("/write/v/")
    assert response.status_code == 200
    assert cookie(client) != value
    names = list(redis_client.scan_iter(match=f"{KEY_PREFIX}:*"))
    assert all(value.encode() not in n for n in names)


# --- activity metadata --------------------------------------------------------------------


@pytest.mark.parametrize(("mode", "expected"), [("truncate", "2001:db8:abcd::/48"),
                                                 ("hash", "hash"), ("none", "")])
def test_ip_storage(mode: str, expected: str) -> None:
    user = make_user()
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                                           "SESSIONS": {"IP_STORAGE": mode}}):
        client = Client(REMOTE_ADDR="2001:db8:abcd:12::1")
        client.post("/login/", {"username": "alice", "password": "pw-alice"})
        (info,) = user_sessions(user)
    if expected == "hash":
        assert len(info.ip) == 16 and "2001" not in info.ip
    else:
        assert info.ip == expected


def test_activity_is_written_at_most_once_per_interval(redis_client: redis.Redis) -> None:
    user = make_user()
    client = device(agent="first")
    (before,) = user_sessions(user)
    client.get("/whoami/", HTTP_USER_AGENT="second")  # within the interval: not rewritten
    assert user_sessions(user)[0].user_agent == "first"
    with override_settings(REDIS_PATTERNS={"CONNECTION": "default", "KEY_PREFIX": KEY_PREFIX,
                                           "SESSIONS": {"ACTIVITY_INTERVAL": 0}}):
        client.get("/whoami/", HTTP_USER_AGENT="second")
        (after,) = user_sessions(user)
    assert after.user_agent == "second"
    assert after.last_activity and before.last_activity
    assert after.last_activity >= before.last_activity
    assert after.created == before.created


def test_anonymous_sessions_get_no_activity_writes(redis_client: redis.Redis) -> None:
    client = Client(HTTP_USER_AGENT="anon")
    client.get("/write/x/")
    (name,) = [k for k in redis_client.scan_iter(match=f"{KEY_PREFIX}:sess:*")]
    assert redis_client.hget(name, "ua") is None


@pytest.mark.parametrize("middleware", [MIDDLEWARE, INNER_MIDDLEWARE], ids=["outer", "inner"])
def test_activity_is_recorded_in_the_login_save_in_either_position(
    own_redis: redis.Redis, middleware: list[str]
) -> None:
    user = make_user()
    with override_settings(MIDDLEWARE=middleware):
        client = device(agent="phone")
        saves_before = int(own_redis.info("commandstats").get("cmdstat_evalsha", {})
                           .get("calls", 0))
        client.get("/write/again/")  # a save: SessionMiddleware's second save is a no-op
        saves = int(own_redis.info("commandstats")["cmdstat_evalsha"]["calls"]) - saves_before
    (info,) = user_sessions(user)
    assert (info.user_agent, info.ip) == ("phone", "203.0.113.0/24")
    assert info.last_activity is not None
    assert saves == 1


# --- operator command ---------------------------------------------------------------------


def test_sessions_command_lists_and_revokes(capsys: pytest.CaptureFixture[str]) -> None:
    user = make_user()
    devices = [device(agent=f"Browser/{i}") for i in range(3)]
    call_command("sessions", "list", "alice")
    out = capsys.readouterr().out
    assert out.count("Browser/0") == 1 and "203.0.113.0/24" in out
    assert cookie(devices[0]) not in out  # handles, never cookies
    handle = session_handle(cookie(devices[1]))
    call_command("sessions", "revoke", str(user.pk), "--session", handle)
    assert [whoami(d) for d in devices] == ["alice", None, "alice"]
    call_command("sessions", "revoke", "alice", "--keep", session_handle(cookie(devices[0])))
    assert "1 session" in capsys.readouterr().out
    assert [whoami(d) for d in devices] == ["alice", None, None]
    with pytest.raises(CommandError, match="no user"):
        call_command("sessions", "list", "nobody")


# --- races: threads and processes ---------------------------------------------------------


def test_logins_racing_logout_everywhere_threads(redis_client: redis.Redis) -> None:
    user = make_user()
    stop = threading.Event()
    errors: list[BaseException] = []

    def log_in_repeatedly() -> None:
        try:
            while not stop.is_set():
                store = SessionStore()
                store[SESSION_KEY] = str(user.pk)
                store.save()
                store["more"] = 1
                try:
                    store.save()
                except Exception as exc:  # UpdateError when revoked in between: fine
                    if type(exc).__name__ != "UpdateError":
                        raise
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=log_in_repeatedly) for _ in range(4)]
    for t in threads:
        t.start()
    for _ in range(20):
        logout_everywhere(user)
    stop.set()
    for t in threads:
        t.join(30)
    assert not errors
    assert_index_exact(redis_client, user)
    logout_everywhere(user)
    assert live_data_keys(redis_client, user) == set()


def test_sessions_created_by_other_processes_are_all_indexed_and_revoked(
    redis_client: redis.Redis, redis_url: str
) -> None:
    user = make_user()
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(2) as pool:
        results = [pool.apply_async(create_sessions, (redis_url, str(user.pk), 150, 1000))
                   for _ in range(2)]
        revoked = 0
        deadline = time.monotonic() + 90
        while not all(r.ready() for r in results) and time.monotonic() < deadline:
            revoked += logout_everywhere(user)
        made = sum(r.get(30) for r in results)
    assert made == 300
    assert_index_exact(redis_client, user)
    assert revoked + logout_everywhere(user) == 300  # each session revoked exactly once
    assert live_data_keys(redis_client, user) == set()


def test_secret_key_rotation_moves_sessions_to_the_new_index_on_their_next_save(
    redis_client: redis.Redis,
) -> None:
    old, new = "o" * 50, "n" * 50
    with override_settings(SECRET_KEY=old):
        store = SessionStore()
        store[SESSION_KEY] = "7"
        store.save()
        old_key = store.session_key or ""
        old_index = f"{KEY_PREFIX}:sess:{{{user_tag('7')}}}:u"
    with override_settings(SECRET_KEY=new, SECRET_KEY_FALLBACKS=[old]):
        assert user_sessions(7) == []  # the new index does not know it yet
        again = SessionStore(old_key)
        assert again[SESSION_KEY] == "7"
        assert again.modified  # scheduled to move
        again.save()
        assert again.session_key != old_key
        assert [s.session_key for s in user_sessions(7)] == [session_handle(again.session_key
                                                                           or "")]
        assert redis_client.exists(old_index) == 0
        assert logout_everywhere(7) == 1


def test_sliding_saves_leave_the_index_alone_and_pruning_respects_the_slack(
    redis_client: redis.Redis,
) -> None:
    user = make_user()
    a, b = SessionStore(), SessionStore()
    for store in (a, b):
        store[SESSION_KEY] = str(user.pk)
        store.save()
    sid_a = session_handle(a.session_key or "")
    score = redis_client.zscore(index_key(user), sid_a)
    a["n"] = 1
    a.save()  # same expiry age, a moment later: within the slack, index untouched
    assert redis_client.zscore(index_key(user), sid_a) == score
    # a live member whose score lags its true expiry by less than the slack (as sliding
    # saves leave it) is never pruned, even once its score is in the past
    now_ms = int(redis_client.time()[0]) * 1000
    tag = user_tag(str(user.pk))
    redis_client.zadd(index_key(user), {sid_a: now_ms - 10_000})
    redis_client.pexpire(f"{KEY_PREFIX}:sess:{{{tag}}}:s:{sid_a}", 40_000)
    b.set_expiry(300)
    b.save()  # rewrites the index (expiry changed by more than the slack) and prunes
    assert sid_a in indexed(redis_client, user)
    redis_client.zadd(index_key(user), {"0" * 32: now_ms - 120_000})  # long expired
    b.set_expiry(3000)
    b.save()
    assert indexed(redis_client, user) == {sid_a, session_handle(b.session_key or "")}
    assert_index_exact(redis_client, user)


def test_save_every_request_slides_the_expiry(redis_client: redis.Redis) -> None:
    user = make_user()
    client = device()
    tag = user_tag(str(user.pk))
    data_key = f"{KEY_PREFIX}:sess:{{{tag}}}:s:{session_handle(cookie(client))}"
    redis_client.pexpire(data_key, 10_000)  # as if two weeks had passed
    whoami(client)  # reads only: without SESSION_SAVE_EVERY_REQUEST nothing is written
    assert redis_client.pttl(data_key) <= 10_000
    with override_settings(SESSION_SAVE_EVERY_REQUEST=True):
        whoami(client)
    from django.conf import settings

    assert redis_client.pttl(data_key) > settings.SESSION_COOKIE_AGE * 1000 - 5000
    assert_index_exact(redis_client, user)


@requires_django_5
@pytest.mark.django_db(transaction=True)  # alogin saves last_login from another thread
def test_async_alogin_and_alogout_keep_the_index_exact(redis_client: redis.Redis) -> None:
    import asyncio

    from django.contrib.auth import alogin, alogout
    from django.test import RequestFactory

    user = make_user()

    async def scenario() -> str:
        request = RequestFactory().get("/")
        request.session = SessionStore()
        await request.session.aset("cart", "x")
        await request.session.asave()
        await alogin(request, user)
        await request.session.asave()  # what the middleware does after the view
        key = request.session.session_key or ""
        assert key.startswith(user_tag(str(user.pk)))
        assert indexed(redis_client, user) == {session_handle(key)}
        await alogout(request)
        return key

    key = asyncio.run(scenario())
    assert indexed(redis_client, user) == set()
    assert SessionStore().exists(key) is False


@pytest.mark.parametrize("bad", [None, ""])
def test_index_functions_name_bad_users(bad: Any) -> None:
    from django.contrib.auth.models import AnonymousUser

    for who in (AnonymousUser(), bad):
        with pytest.raises(ValueError, match="user"):
            user_sessions(who)
        with pytest.raises(ValueError, match="user"):
            logout_everywhere(who)


@pytest.mark.parametrize(("address", "stored"), [
    ("203.0.113.77", "203.0.113.0/24"), ("::ffff:203.0.113.77", "203.0.113.0/24"),
    ("2001:db8:abcd:12::1", "2001:db8:abcd::/48"), ("not an ip", ""), ("", ""),
])
def test_stored_ip_truncation(address: str, stored: str) -> None:
    from django_redispatterns.middleware.sessions import stored_ip

    assert stored_ip(address) == stored


def test_sessions_command_user_is_a_pk_or_a_username(capsys: pytest.CaptureFixture[str]) -> None:
    alice = make_user()
    device(agent="Browser/pk")
    # a username made of digits that is nobody's pk: found as a username
    digits = get_user_model().objects.create_user(username=str(alice.pk + 1000), password="pw")
    for value in (str(alice.pk), "alice"):
        for argv in (["list", value], ["list", "--user", value]):
            call_command("sessions", *argv)
            out = capsys.readouterr().out
            assert "1 live session(s) of alice" in out and "Browser/pk" in out, (argv, out)
    call_command("sessions", "list", "--user", digits.get_username())
    assert "0 live session(s) of " + digits.get_username() in capsys.readouterr().out
    call_command("sessions", "revoke", "--user", "alice")
    assert "revoked 1 session" in capsys.readouterr().out
    with pytest.raises(CommandError, match="no user"):
        call_command("sessions", "list", "--user", "nobody")
    with pytest.raises(CommandError, match="name one user"):
        call_command("sessions", "list")
    with pytest.raises(CommandError, match="name one user"):
        call_command("sessions", "list", "alice", "--user", "bob")
