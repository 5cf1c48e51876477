"""Fault-matrix entry points called from Python: the session engine, the cache backend's
public methods (sync and async) and ``@cached``, locks and their decorators, the operator
commands and ``check --deploy`` (tests/test_fault_matrix.py runs them)."""

from __future__ import annotations

import asyncio
import io
from collections import Counter
from collections.abc import Callable
from typing import Any

import redis
from django.core.cache import caches
from django.core.management import call_command
from django.core.management.base import BaseCommand, CommandError

from django_redispatterns.cache.decorators import cached
from django_redispatterns.exceptions import BackendUnavailable
from django_redispatterns.locks import Lock, locked, single_flight
from django_redispatterns.sessions import SessionStore, logout_everywhere
from tests.matrix_faults import Cell, Raised, app_on, entry, raised, returned

RUNS: Counter[str] = Counter()

# --- the session engine: BackendUnavailable, never an empty session -------------------


def _stored_session() -> str:
    session = SessionStore()
    session["v"] = 1
    session.create()
    assert session.session_key is not None
    return session.session_key


def _engine_load(cell: Cell, load: Callable[[SessionStore], Any]) -> None:
    with app_on(cell.server):
        key = _stored_session()
        outcome = cell.during(lambda: load(SessionStore(key)))
        if cell.down:
            raised(outcome, BackendUnavailable)  # not {} (that would sign the user out)
        else:
            assert returned(outcome) == {"v": 1}  # a read: served by a full or replica Redis


def _engine_save(cell: Cell, save: Callable[[SessionStore], Any]) -> None:
    with app_on(cell.server):
        key = _stored_session()
        session = SessionStore(key)
        session["v"] = 2  # loads it, healthy
        outcome = cell.during(lambda: save(session))
        if cell.healthy_answer:
            returned(outcome)
            assert SessionStore(key).load() == {"v": 2}
            return
        raised(outcome, BackendUnavailable)
        assert session.session_key == key  # kept: the cookie stays valid
        if cell.writes_refused:
            assert SessionStore(key).load() == {"v": 1}  # refused whole, nothing half-written


@entry("session_engine_load", "sessions")
def session_engine_load(cell: Cell) -> None:
    _engine_load(cell, lambda session: session.load())


@entry("session_engine_aload", "sessions")
def session_engine_aload(cell: Cell) -> None:
    _engine_load(cell, lambda session: asyncio.run(session.aload()))


@entry("session_engine_save", "sessions")
def session_engine_save(cell: Cell) -> None:
    _engine_save(cell, lambda session: session.save())


@entry("session_engine_asave", "sessions")
def session_engine_asave(cell: Cell) -> None:
    _engine_save(cell, lambda session: asyncio.run(session.asave()))


# --- the cache backend (IGNORE_EXCEPTIONS): reads miss, writes are skipped ------------
#
# Each method: (prepare(cache), call(cache, asynchronous), check(cell, cache, outcome)).


def _sync_or_async(cache: Any, asynchronous: bool, method: str, *args: Any) -> Any:
    if asynchronous:
        return asyncio.run(getattr(cache, f"a{method}")(*args))
    return getattr(cache, method)(*args)


def _prepared(cache: Any) -> None:
    cache.set_many({"k": "v", "k2": "v2", "n": 1}, 60)


def check_get(cell: Cell, cache: Any, outcome: Any) -> None:
    assert returned(outcome) == (None if cell.down else "v")  # a miss, never a stale value


def check_get_many(cell: Cell, cache: Any, outcome: Any) -> None:
    assert returned(outcome) == ({} if cell.down else {"k": "v", "k2": "v2"})


def check_set(cell: Cell, cache: Any, outcome: Any) -> None:
    stored = returned(outcome)
    if cell.healthy_answer:
        assert stored is True and cache.get("k") == "new"
        return
    assert stored is False  # skipped, and it says so
    if cell.writes_refused:
        assert cache.get("k") == "v"


def check_set_many(cell: Cell, cache: Any, outcome: Any) -> None:
    failed = returned(outcome)
    if cell.healthy_answer:
        assert failed == [] and cache.get_many(["k", "k2"]) == {"k": "new", "k2": "new2"}
        return
    assert sorted(failed) == ["k", "k2"]  # Django's contract: the keys not stored
    if cell.writes_refused:
        assert cache.get("k") == "v"


def check_delete(cell: Cell, cache: Any, outcome: Any) -> None:
    deleted = returned(outcome)
    # A full Redis still deletes (that frees memory); a replica or a dead server cannot.
    gone = cell.fault in ("oom", "noscript")
    assert deleted is gone
    if cell.fault != "refused" and cell.fault != "hung":  # (a late DEL may land on waking)
        assert (cache.get("k") is None) is gone


def check_touch(cell: Cell, cache: Any, outcome: Any) -> None:
    touched = returned(outcome)
    gone = cell.fault in ("oom", "noscript")  # EXPIRE is allowed on a full Redis
    assert touched is gone


def check_incr(cell: Cell, cache: Any, outcome: Any) -> None:
    if cell.healthy_answer:
        assert returned(outcome) == 2 and cache.get("n") == 2
        return
    # No count is made up, and the key is not said to be missing (ValueError): None
    assert returned(outcome) is None
    if cell.writes_refused:
        assert cache.get("n") == 1


def check_clear(cell: Cell, cache: Any, outcome: Any) -> None:
    returned(outcome)
    if cell.fault in ("oom", "noscript"):
        assert cache.get("k") is None
    elif cell.fault == "readonly":
        assert cache.get("k") == "v"


def check_get_or_set(cell: Cell, cache: Any, outcome: Any) -> None:
    assert returned(outcome) == "computed"  # computed whatever the fault
    assert RUNS["get_or_set"] == 1
    stored = cache.get("fresh")
    if cell.healthy_answer:
        assert stored == "computed"
        assert cache.get_or_set("fresh", lambda: "again", 60) == "computed"  # cached
    elif cell.writes_refused:
        assert stored is None  # not stored


CACHE_METHODS: dict[str, tuple[Callable[[Any, bool], Any], Any]] = {
    "get": (lambda c, a: _sync_or_async(c, a, "get", "k"), check_get),
    "get_many": (lambda c, a: _sync_or_async(c, a, "get_many", ["k", "k2"]), check_get_many),
    "set": (lambda c, a: _sync_or_async(c, a, "set", "k", "new", 60), check_set),
    "set_many": (lambda c, a: _sync_or_async(c, a, "set_many", {"k": "new", "k2": "new2"}, 60),
                 check_set_many),
    "delete": (lambda c, a: _sync_or_async(c, a, "delete", "k"), check_delete),
    "touch": (lambda c, a: _sync_or_async(c, a, "touch", "k", 120), check_touch),
    "incr": (lambda c, a: _sync_or_async(c, a, "incr", "n"), check_incr),
    "clear": (lambda c, a: _sync_or_async(c, a, "clear"), check_clear),
}


def _compute() -> str:
    RUNS["get_or_set"] += 1
    return "computed"


CACHE_METHODS["get_or_set"] = (
    lambda c, a: _sync_or_async(c, a, "get_or_set", "fresh", _compute, 60), check_get_or_set)


# Without IGNORE_EXCEPTIONS: where Redis cannot serve the call, the redis-py error.
STRICT_ERRORS = {"refused": redis.ConnectionError, "hung": redis.TimeoutError,
                 "oom": redis.exceptions.OutOfMemoryError,
                 "readonly": redis.exceptions.ReadOnlyError}
SERVED_WHEN_FULL = {"get", "get_many", "delete", "touch", "clear"}
SERVED_BY_A_REPLICA = {"get", "get_many"}


def _strict(method: str, check: Any) -> Any:
    def strict_check(cell: Cell, cache: Any, outcome: Any) -> None:
        if (cell.healthy_answer or (cell.fault == "oom" and method in SERVED_WHEN_FULL)
                or (cell.fault == "readonly" and method in SERVED_BY_A_REPLICA)):
            check(cell, cache, outcome)  # served as with IGNORE_EXCEPTIONS
            return
        raised(outcome, STRICT_ERRORS[cell.fault])  # the redis-py error, not django-redis's
        if method == "get_or_set":
            assert RUNS["get_or_set"] == 0  # the callable did not run
    return strict_check


def _cache_entry(method: str, asynchronous: bool, strict: bool = False) -> None:
    call, check = CACHE_METHODS[method]
    if strict:
        check = _strict(method, check)

    def run(cell: Cell) -> None:
        with app_on(cell.server):
            cache = caches["strict" if strict else "patterns"]
            cache.clear()
            _prepared(cache)
            RUNS.clear()
            outcome = cell.during(lambda: call(cache, asynchronous))
            check(cell, cache, outcome)

    name = f"cache_{'a' if asynchronous else ''}{method}{'_strict' if strict else ''}"
    entry(name, "cache_strict" if strict else "cache")(run)


for _strict_mode in (False, True):
    for _method in CACHE_METHODS:
        _cache_entry(_method, False, _strict_mode)
        _cache_entry(_method, True, _strict_mode)


@cached(60, key="matrix:report", cache="patterns")
def report() -> int:
    RUNS["report"] += 1
    return 42


@cached(60, key="matrix:areport", cache="patterns")
async def areport() -> int:
    RUNS["report"] += 1
    return 42


def _cached(cell: Cell, call: Callable[[], Any]) -> None:
    with app_on(cell.server):
        caches["patterns"].clear()
        RUNS.clear()
        assert returned(cell.during(call)) == 42  # computed whatever the fault
        assert call() == 42
        # Stored only where writes work: computed again after a refused write; after a
        # hang the store sent during it may land late (then it is served).
        expected = {"noscript": {1}, "hung": {1, 2}}.get(cell.fault, {2})
        assert RUNS["report"] in expected, RUNS


@entry("cached_decorator", "cache")
def cached_decorator(cell: Cell) -> None:
    _cached(cell, report)


@entry("cached_decorator_async", "cache")
def cached_decorator_async(cell: Cell) -> None:
    _cached(cell, lambda: asyncio.run(areport()))


# --- locks: fail closed --------------------------------------------------------------


@entry("lock_acquire", "locks")
def lock_acquire(cell: Cell) -> None:
    with app_on(cell.server):
        lock = Lock("matrix-acquire", ttl=5, auto_renew=False)
        outcome = cell.during(lock.acquire)
        if cell.healthy_answer:
            assert returned(outcome) is True and isinstance(lock.fencing_token, int)
            lock.release()
            return
        raised(outcome, BackendUnavailable)  # never "held by someone else" (False)


@entry("lock_release", "locks")
def lock_release(cell: Cell) -> None:
    with app_on(cell.server):
        lock = Lock("matrix-release", ttl=5, auto_renew=False)
        assert lock.acquire()
        outcome = cell.during(lock.release)
        if cell.fault in ("oom", "noscript"):  # a full Redis still deletes
            returned(outcome)
            assert Lock("matrix-release", ttl=5).acquire(wait=0)
            return
        raised(outcome, BackendUnavailable)  # the lease then ends by its TTL


@entry("lock_aacquire", "locks")
def lock_aacquire(cell: Cell) -> None:
    with app_on(cell.server):
        lock = Lock("matrix-aacquire", ttl=5, auto_renew=False)
        outcome = cell.during(lambda: asyncio.run(lock.aacquire()))
        if cell.healthy_answer:
            assert returned(outcome) is True and isinstance(lock.fencing_token, int)
            lock.release()
            return
        raised(outcome, BackendUnavailable)


@entry("lock_arelease", "locks")
def lock_arelease(cell: Cell) -> None:
    with app_on(cell.server):
        lock = Lock("matrix-arelease", ttl=5, auto_renew=False)
        assert lock.acquire()
        outcome = cell.during(lambda: asyncio.run(lock.arelease()))
        if cell.fault in ("oom", "noscript"):
            returned(outcome)
            assert Lock("matrix-arelease", ttl=5).acquire(wait=0)
            return
        raised(outcome, BackendUnavailable)


@locked("matrix-locked", ttl=5)
def locked_job() -> str:
    RUNS["locked"] += 1
    return "done"


@entry("locked_decorator", "locks")
def locked_decorator(cell: Cell) -> None:
    with app_on(cell.server):
        RUNS.clear()
        outcome = cell.during(locked_job)
        if cell.healthy_answer:
            assert returned(outcome) == "done" and RUNS["locked"] == 1
            return
        raised(outcome, BackendUnavailable)
        assert RUNS["locked"] == 0


class SingleFlightCommand(BaseCommand):
    @single_flight(name="matrix-single-flight", ttl=5)
    def handle(self, *args: Any, **options: Any) -> None:
        RUNS["single_flight"] += 1


@entry("single_flight_decorator", "locks")
def single_flight_decorator(cell: Cell) -> None:
    with app_on(cell.server):
        RUNS.clear()
        outcome = cell.during(lambda: SingleFlightCommand().handle())
        if cell.healthy_answer:
            returned(outcome)
            assert RUNS["single_flight"] == 1
            return
        raised(outcome, CommandError, "Redis unavailable")  # not "skipped"
        assert RUNS["single_flight"] == 0


# --- operator commands and the deploy checks ----------------------------------------


def _command(cell: Cell, *args: str, reads_only: bool = True) -> str | None:
    """Run a command in the fault: with nothing answering, one line naming the server and
    the error (exit status 1), never a traceback; otherwise its normal output."""
    out, err = io.StringIO(), io.StringIO()
    outcome = cell.during(lambda: call_command(*args, stdout=out, stderr=err))
    if cell.down or (cell.writes_refused and not reads_only):
        exc = raised(outcome, CommandError, f"Redis at {cell.server.url}")
        assert "failed: " in str(exc) and "\n" not in str(exc), str(exc)
        assert getattr(exc, "returncode", 1) == 1
        return None
    returned(outcome)
    return out.getvalue()


@entry("locks_command", "commands")
def locks_command(cell: Cell) -> None:
    with app_on(cell.server):
        lock = Lock("matrix-listed", ttl=30, auto_renew=False)
        assert lock.acquire()
        output = _command(cell, "locks", "list")
        if output is not None:
            assert "matrix-listed" in output


@entry("idempotency_command", "commands")
def idempotency_command(cell: Cell) -> None:
    with app_on(cell.server):
        output = _command(cell, "idempotency", "count")
        if output is not None:
            assert output.strip()


@entry("sessions_command", "commands")
def sessions_command(cell: Cell) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    with app_on(cell.server):
        user = get_user_model().objects.create_user(username=f"matrix-{cell.fault}")
        Client().force_login(user)
        output = _command(cell, "sessions", "list", str(user.pk))
        if output is not None:
            assert output.strip() and "no " not in output.lower(), output


@entry("ratelimit_command", "commands")
def ratelimit_command(cell: Cell) -> None:
    with app_on(cell.server):
        output = _command(cell, "ratelimit", "inspect", "--group", "matrix-cmd",
                          "--rate", "10/m", "--identity", "192.0.2.9")
        if output is not None:
            assert "10" in output


@entry("redis_audit_command", "commands")
def redis_audit_command(cell: Cell) -> None:
    with app_on(cell.server):
        output = _command(cell, "redis_audit")
        if output is not None:
            assert output.strip()


def _writing_command(cell: Cell, *args: str) -> str | None:
    """A command that deletes: a full Redis still deletes, a replica cannot."""
    output = _command(cell, *args, reads_only=cell.fault == "oom")
    assert (output is None) == (cell.down or cell.fault == "readonly")
    return output


@entry("locks_release_command", "commands")
def locks_release_command(cell: Cell) -> None:
    with app_on(cell.server):
        assert Lock("matrix-forced", ttl=30, auto_renew=False).acquire()
        output = _writing_command(cell, "locks", "release", "matrix-forced", "--force")
        if output is not None:
            assert Lock("matrix-forced", ttl=5).acquire(wait=0)  # really released


@entry("ratelimit_reset_command", "commands")
def ratelimit_reset_command(cell: Cell) -> None:
    with app_on(cell.server):
        _writing_command(cell, "ratelimit", "reset", "--group", "matrix-cmd", "--rate",
                         "10/m", "--identity", "192.0.2.9")


@entry("sessions_revoke_command", "commands")
def sessions_revoke_command(cell: Cell) -> None:
    from django.contrib.auth import get_user_model
    from django.test import Client

    with app_on(cell.server):
        user = get_user_model().objects.create_user(username=f"matrix-revoke-{cell.fault}")
        # (a rolled-back earlier test may have had this primary key, and sessions)
        logout_everywhere(user)
        Client().force_login(user)
        output = _writing_command(cell, "sessions", "revoke", str(user.pk))
        if output is not None:
            assert "revoked 1 session" in output, output


@entry("check_deploy", "commands")
def check_deploy(cell: Cell) -> None:
    """``check --deploy`` never fails on an unreachable Redis: it warns, naming it."""
    with app_on(cell.server):
        out, err = io.StringIO(), io.StringIO()
        outcome = cell.during(lambda: call_command(
            "check", "--deploy", "--tag", "redispatterns", stdout=out, stderr=err))
        returned(outcome)
        text = out.getvalue() + err.getvalue()
        warned = {"refused": "W010", "hung": "W010", "oom": "W014", "readonly": "W015"}
        if cell.fault in warned:
            assert f"redispatterns.{warned[cell.fault]}" in text, text
        else:
            assert "redispatterns.W010" not in text, text


__all__ = ["Raised"]
