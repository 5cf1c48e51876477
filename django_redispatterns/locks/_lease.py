"""Lock and MultiLock: leased, owner-checked, fenced locks on one Redis or a Redlock quorum."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hashlib
import itertools
import json
import logging
import os
import random
import re
import secrets
import socket
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any

import redis
from redis.exceptions import NoScriptError

from .. import connection, keys, scripts, signals
from ..conf import get_config
from ..exceptions import BackendUnavailable, LockLost, LockNotAcquired, LockNotOwned
from . import _heartbeat

logger = logging.getLogger("django_redispatterns.locks")

DEFAULT_NAMESPACE = "locks"
_SIMPLE_NAME = re.compile(r"[A-Za-z0-9_.\-/]{1,100}")
_NAMESPACE = re.compile(r"[A-Za-z0-9_.\-]{1,50}")
_MIN_DELAY = 0.005  # first back-off step while waiting (seconds)
_MAX_DELAY = 0.2  # back-off cap: a waiter asks Redis at most ~5 times a second
_DRIFT_FACTOR = 0.01  # Redlock: clock drift allowance, 1 % of the TTL + 2 ms
_HOST = socket.gethostname()


# --- keys -------------------------------------------------------------------------------


def name_part(name: str) -> str:
    """The key segment for a lock name: the name itself when short and plain, else a digest.

    The digest is a plain SHA-256 (not keyed by SECRET_KEY): a key that changed when the
    secret is rotated would let an old and a new host hold "the same" lock at once.
    """
    if _SIMPLE_NAME.fullmatch(name):
        return name
    return "#" + hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()[:40]


def held_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The key holding the lease of ``name`` (token, fencing token, owner metadata)."""
    return _keys(keys.prefix(), namespace, name)[0]


def fence_key(name: str, namespace: str = DEFAULT_NAMESPACE) -> str:
    """The fencing counter of ``name``."""
    return _keys(keys.prefix(), namespace, name)[1]


@functools.lru_cache(maxsize=4096)
def _keys(prefix: str, namespace: str, name: str) -> tuple[str, str]:
    # Keyed on the prefix too, so a settings change (override_settings) is honoured.
    part = name_part(name)
    return (keys.make_key("lock", "held", part, tag=namespace),
            keys.make_key("lock", "fence", part, tag=namespace))


def connection_names(quorum: Sequence[Any], connection: str | None = None) -> list[str]:
    """Where locks live: every quorum member, else ``connection`` or the LOCKS connection."""
    if quorum:
        return [str(c) for c in quorum]
    return [connection or get_config().connection_for("LOCKS")]


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name:
        raise ValueError(f"a lock name must be a non-empty str, got {name!r}")
    return name


def _check_namespace(namespace: object) -> str:
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"a lock namespace must be 1-50 characters of A-Z a-z 0-9 _ . -, got {namespace!r}"
        )
    return namespace


def _check_seconds(what: str, value: object, *, allow_zero: bool) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{what} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or value != value:
        raise ValueError(f"{what} must be {'>= 0' if allow_zero else '> 0'}, got {value!r}")
    return float(value)


def _ms(seconds: float) -> int:
    return max(1, int(seconds * 1000))


# --- tokens ---------------------------------------------------------------------------
# A token is unique per acquisition: 128 random bits drawn once per process (again after a
# fork) followed by a counter. Reading os.urandom for every acquisition cost as much as a
# third of a Redis round trip; uniqueness, not secrecy, is what the owner check needs.

_token_prefix = secrets.token_hex(16)
_token_counter = itertools.count(1)


def _reseed_tokens() -> None:
    global _token_prefix, _token_counter
    _token_prefix = secrets.token_hex(16)
    _token_counter = itertools.count(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reseed_tokens)


def new_token() -> str:
    """A token never issued before by any process (32 random hex digits + a counter)."""
    return f"{_token_prefix}{next(_token_counter):x}"


# --- in-process wake-up -----------------------------------------------------------------
# A release in this process wakes this process's waiters at once; waiters in other
# processes rely on the bounded, jittered back-off (they never spin on Redis).

class _Wakeups:
    """Per-key wake-ups for waiters in this process: a release wakes one waiter of its key.

    Waking one (not all) avoids a herd of attempts of which all but one must fail; the rest
    keep their back-off timers, so a missed or wasted wake-up costs at most one back-off step.
    """

    def __init__(self) -> None:
        self.mutex = threading.Lock()
        self.waiting: dict[str, list[Any]] = {}  # key -> [Condition, waiters, releases]
        self.releases: dict[str, int] = {}

    def generation(self, key: str) -> int:
        return self.releases.get(key, 0)

    def notify(self, keys: Sequence[str]) -> None:
        if not self.waiting:  # the common, uncontended case takes no lock
            return
        with self.mutex:
            for key in keys:
                self.releases[key] = self.releases.get(key, 0) + 1
                entry = self.waiting.get(key)
                if entry is not None:
                    with entry[0]:
                        entry[0].notify()

    def sleep(self, key: str, seconds: float, generation: int) -> None:
        with self.mutex:
            entry = self.waiting.setdefault(key, [threading.Condition(), 0])
            entry[1] += 1
            condition = entry[0]
        try:
            with condition:
                if self.releases.get(key, 0) == generation:
                    condition.wait(seconds)
        finally:
            with self.mutex:
                entry[1] -= 1
                if entry[1] == 0:
                    del self.waiting[key]
                    self.releases.pop(key, None)


_wakeups = _Wakeups()


# --- one attempt ------------------------------------------------------------------------


@dataclass
class _Attempt:
    ok: bool
    fences: list[int]
    holder_pttl: int = -1  # when not ok: the holder's remaining lease in ms (-1 unknown)
    conflict: int = 0  # when not ok: 1-based index of the name someone else holds
    validity: float = 0.0  # when ok: seconds the lease is known to last from the start


_ACQUIRE = "lock_acquire"
_RELEASE = "lock_release"
_EXTEND = "lock_extend"
_FENCE_FLOOR = "lock_fence_floor"


def _parse_acquire(reply: Any) -> _Attempt:
    if int(reply[0]) == 1:
        return _Attempt(True, [int(f) for f in reply[1:]])
    return _Attempt(False, [], holder_pttl=int(reply[2]), conflict=int(reply[1]))


class _Base:
    """What Lock and MultiLock share: the lease, its heartbeat and the Redis round trips."""

    def __init__(
        self,
        names: Sequence[str],
        ttl: float | None,
        *,
        wait: float,
        auto_renew: bool,
        namespace: str,
        connection: str | None,
        quorum: Sequence[str] | None,
        owner: str | None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
    ) -> None:
        config = get_config().feature("LOCKS")
        self.names: tuple[str, ...] = tuple(names)
        self.namespace = _check_namespace(namespace)
        self.ttl = _check_seconds("ttl", config["TTL"] if ttl is None else ttl, allow_zero=False)
        self.wait = _check_seconds("wait", wait, allow_zero=True)
        self.auto_renew = bool(auto_renew)
        self._fencing_ttl_ms = _ms(float(config["FENCING_TTL"]))
        prefix = keys.prefix()
        pairs = [_keys(prefix, self.namespace, n) for n in self.names]
        self._held_keys = [held for held, _ in pairs]
        self._fence_keys = [fence for _, fence in pairs]
        self._connection = connection
        self._quorum = list(config["QUORUM"] if quorum is None else quorum)
        self._owner = owner
        if isinstance(min_replicas, bool) or not isinstance(min_replicas, int) or min_replicas < 0:
            raise ValueError(f"min_replicas must be an int >= 0, got {min_replicas!r}")
        if min_replicas and self._quorum:
            raise ValueError("min_replicas and quorum mode do not combine; pick one")
        self.min_replicas = min_replicas
        self.replica_timeout = _check_seconds("replica_timeout", replica_timeout,
                                              allow_zero=False)
        self._acked = 0
        self._meta_head: str | None = None
        self._sync_clients: list[Any] | None = None
        self.token: str | None = None
        self.fencing_tokens: dict[str, int] = {}
        self._lost_reason: str | None = None
        self._lease_ends = 0.0  # time.monotonic() after which the lease may be gone
        self._renewal: _heartbeat.Renewal | None = None
        self._task: asyncio.Task[None] | None = None
        self._state = threading.Lock()

    # -- description -------------------------------------------------------------------

    @property
    def label(self) -> str:
        return self.names[0] if len(self.names) == 1 else ",".join(self.names)

    @property
    def quorum_mode(self) -> bool:
        return bool(self._quorum)

    def __repr__(self) -> str:
        state = "held" if self.token else "free"
        return f"<{type(self).__name__} {self.label!r} ttl={self.ttl:g}s {state}>"

    @property
    def lost(self) -> bool:
        """True once the heartbeat (or a release) found the lease gone or taken over."""
        return self._lost_reason is not None

    def check(self) -> None:
        """Raise :class:`LockLost` now if the lease is known to be lost (a checkpoint)."""
        if self._lost_reason is not None:
            raise self._lost_error()

    def _meta(self) -> str:
        if self._meta_head is None:
            self._meta_head = json.dumps(
                {"name": self.label[:200], "host": _HOST, "pid": os.getpid(),
                 "by": self._owner or ""}, separators=(",", ":"))[:-1]
        return f'{self._meta_head},"since":{time.time():.3f}}}'

    # -- clients -----------------------------------------------------------------------

    def _connections(self) -> list[str]:
        return connection_names(self._quorum, self._connection)

    def _clients(self) -> list[Any]:
        if self._sync_clients is None:
            self._sync_clients = [connection.client_for(c) for c in self._connections()]
        return self._sync_clients

    def _async_clients(self) -> list[Any]:
        return [connection.async_client_for(c) for c in self._connections()]

    def _acquire_call(self, token: str) -> tuple[list[str], list[Any]]:
        return (self._held_keys + self._fence_keys,
                [token, _ms(self.ttl), self._fencing_ttl_ms, self._meta()])

    # -- sync round trips --------------------------------------------------------------

    def _attempt(self, token: str) -> _Attempt:
        if self._quorum:
            return self._attempt_quorum(token)
        client = self._clients()[0]
        keys_, args = self._acquire_call(token)
        lua = scripts.script(_ACQUIRE)
        started = time.monotonic()
        send = self._acquire_and_wait if self.min_replicas else lua
        try:
            try:
                reply = send(client, keys_, args)
            except redis.TimeoutError:
                # SPEC D4: the script may have run and only the reply was lost. Re-sending it
                # with the same token is safe: a key already holding our token counts as ours.
                reply = send(client, keys_, args)
        except redis.RedisError as exc:
            self._release_quietly(token)
            raise self._unavailable("acquire", exc) from exc
        attempt = _parse_acquire(reply)
        if self._replicas_missing(attempt):
            self._release_quietly(token)
            raise self._replicas_error()
        attempt.validity = self.ttl
        self._lease_ends = started + self.ttl
        return attempt

    def _replicas_missing(self, attempt: _Attempt) -> bool:
        return bool(attempt.ok and self.min_replicas and self._acked < self.min_replicas)

    def _replicas_error(self) -> BackendUnavailable:
        return self._unavailable("acquire", RuntimeError(
            f"{self._acked} of {self.min_replicas} replicas acknowledged the lock within "
            f"{self.replica_timeout:g}s; released it rather than risk losing it on failover"))

    def _acquire_pipe(self, client: Any, command: str, keys_: list[str], args: list[Any]) -> Any:
        lua = scripts.script(_ACQUIRE)
        pipe = client.pipeline(transaction=False)
        pipe.execute_command(command, lua.sha if command == "EVALSHA" else lua.source,
                             len(keys_), *keys_, *args)
        pipe.execute_command("WAIT", self.min_replicas, _ms(self.replica_timeout))
        return pipe

    def _waited(self, results: list[Any]) -> Any:
        """The script's reply from [reply, WAIT count]; None when NOSCRIPT (it did not run)."""
        reply, acked = results
        if isinstance(reply, NoScriptError):
            return None
        for result in (reply, acked):
            if isinstance(result, Exception):
                raise result
        self._acked = int(acked)
        return reply

    def _acquire_and_wait(self, client: Any, keys_: list[str], args: list[Any]) -> Any:
        """The acquire script, then ``WAIT`` on the same connection: one round trip."""
        if connection.is_cluster(client):
            raise ValueError("min_replicas needs a single-master client (WAIT is per "
                             "connection); it is not supported on Redis Cluster")
        for command in ("EVALSHA", "EVAL"):  # EVAL only after NOSCRIPT
            reply = self._waited(
                self._acquire_pipe(client, command, keys_, args).execute(raise_on_error=False))
            if reply is not None:
                return reply
        raise NoScriptError("script cache lost twice in a row")

    async def _aacquire_and_wait(self, client: Any, keys_: list[str], args: list[Any]) -> Any:
        """Async twin of :meth:`_acquire_and_wait`."""
        for command in ("EVALSHA", "EVAL"):
            pipe = self._acquire_pipe(client, command, keys_, args)
            reply = self._waited(await pipe.execute(raise_on_error=False))
            if reply is not None:
                return reply
        raise NoScriptError("script cache lost twice in a row")

    def _attempt_quorum(self, token: str) -> _Attempt:
        clients = self._clients()
        keys_, args = self._acquire_call(token)
        lua = scripts.script(_ACQUIRE)
        started = time.monotonic()
        replies: list[Any] = []
        for client in clients:  # sequential: each call is one short round trip
            try:
                replies.append(lua(client, keys_, args))
            except redis.RedisError as exc:
                logger.warning("lock %r: quorum member unavailable during acquire: %s",
                               self.label, exc)
                replies.append(None)
        self._require_quorum(token, replies)
        attempt = self._decide_quorum(replies, started)
        if attempt.ok:
            # Write the chosen tokens back: the next majority overlaps this one in at least
            # one master, so it issues higher tokens than ours.
            floor = scripts.script(_FENCE_FLOOR)
            written = 0
            for client in clients:
                with contextlib.suppress(redis.RedisError):
                    floor(client, self._fence_keys, [*attempt.fences, self._fencing_ttl_ms])
                    written += 1
            attempt = self._settle_quorum(attempt, written, started)
        if not attempt.ok:
            self._release_quietly(token)  # Redlock: undo the minority's holds at once
        return attempt

    def _require_quorum(self, token: str, replies: list[Any]) -> None:
        answered = sum(1 for r in replies if r is not None)
        if answered < self._majority():
            self._release_quietly(token)
            raise self._unavailable(
                "acquire", RuntimeError(f"only {answered} of {len(replies)} quorum members "
                                        "answered"))

    def _majority(self) -> int:
        return len(self._connections()) // 2 + 1

    def _decide_quorum(self, replies: list[Any], started: float) -> _Attempt:
        parsed = [_parse_acquire(r) for r in replies if r is not None]
        ok = [a for a in parsed if a.ok]
        validity = self.ttl - (time.monotonic() - started) - (self.ttl * _DRIFT_FACTOR + 0.002)
        if len(ok) >= self._majority() and validity > 0:
            fences = [max(a.fences[i] for a in ok) for i in range(len(self.names))]
            return _Attempt(True, fences, validity=validity)
        return _Attempt(False, [], holder_pttl=max((a.holder_pttl for a in parsed), default=-1))

    def _settle_quorum(self, attempt: _Attempt, written: int, started: float) -> _Attempt:
        if written < self._majority():
            return _Attempt(False, [])
        self._lease_ends = started + attempt.validity
        return attempt

    def _release_quietly(self, token: str) -> None:
        for client in self._clients():
            with contextlib.suppress(redis.RedisError):
                scripts.script(_RELEASE)(client, self._held_keys, [token])

    def _unavailable(self, action: str, exc: Exception) -> BackendUnavailable:
        logger.error("lock %r: Redis unavailable during %s: %s", self.label, action, exc)
        return BackendUnavailable(f"could not {action} lock {self.label!r}: Redis unavailable "
                                  f"({type(exc).__name__}: {exc})")

    def _count(self, script: str, args: list[Any], action: str) -> int:
        """Run release/extend on every connection; the number of keys still ours."""
        lua = scripts.script(script)
        results: list[int] = []
        error: Exception | None = None
        for client in self._clients():
            try:
                results.append(int(lua(client, self._held_keys, args)))
            except redis.RedisError as exc:
                error = exc
        return self._count_result(results, error, action)

    def _count_result(self, results: list[int], error: Exception | None, action: str) -> int:
        n = len(self.names)
        if not self._quorum:
            if error is not None:
                raise self._unavailable(action, error)
            return results[0]
        # Quorum: a name counts as ours when a majority still holds our token.
        full = sum(1 for r in results if r == n)
        if full >= self._majority():
            return n
        if error is not None and len(results) < self._majority():
            raise self._unavailable(action, error)
        return 0

    # -- acquiring ---------------------------------------------------------------------

    def _begin(self) -> str:
        with self._state:
            if self.token is not None:
                raise RuntimeError(
                    f"{self!r} is already held by this instance; locks are not reentrant "
                    "(create one Lock per holder, they are cheap)"
                )
            token = new_token()
            self.token = token  # reserve the instance while the attempt runs
            return token

    def _won(self, token: str, attempt: _Attempt) -> None:
        self.fencing_tokens = dict(zip(self.names, attempt.fences, strict=True))
        self._lost_reason = None
        logger.debug("lock %r acquired (fencing token %s)", self.label, attempt.fences)
        signals.lock_acquired.send(type(self), name=self.label, token=token,
                                   fencing_token=self._fence_value())

    def _report_wait(self, started: float, *, acquired: bool) -> None:
        if signals.lock_waited.receivers:
            signals.lock_waited.send(type(self), name=self.label, acquired=acquired,
                                     seconds=time.monotonic() - started)

    def _fence_value(self) -> int | None:
        return max(self.fencing_tokens.values()) if self.fencing_tokens else None

    def _backoff(self, attempt: _Attempt, delay: float, remaining: float) -> float:
        # Full jitter spreads waiters; never sleep past our deadline or the holder's lease.
        pause = random.uniform(delay / 2, delay)
        if attempt.holder_pttl > 0:
            pause = min(pause, attempt.holder_pttl / 1000 + 0.001)
        return max(0.0, min(pause, remaining))

    def acquire(self, wait: float | None = None) -> bool:
        """Take the lock, waiting up to ``wait`` seconds (default: the ``wait`` given).

        Returns True when every name is now held by this instance with a fresh token and
        fencing token(s); False when another owner still held it when the wait ran out.
        Raises :class:`BackendUnavailable` when Redis cannot be reached (fail closed).
        """
        wait = self.wait if wait is None else _check_seconds("wait", wait, allow_zero=True)
        token = self._begin()
        deadline = time.monotonic() + wait
        delay = _MIN_DELAY
        try:
            while True:
                generations = [_wakeups.generation(k) for k in self._held_keys]
                attempt = self._attempt(token)
                if attempt.ok:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.token = None
                    self._report_wait(deadline - wait, acquired=False)
                    return False
                i = max(0, attempt.conflict - 1)
                _wakeups.sleep(self._held_keys[i], self._backoff(attempt, delay, remaining),
                               generations[i])
                delay = min(delay * 2, _MAX_DELAY)
        except BaseException:
            self.token = None
            raise
        self._won(token, attempt)
        if delay > _MIN_DELAY:  # it slept at least once: the lock was held when asked
            self._report_wait(deadline - wait, acquired=True)
        if self.auto_renew:
            self._renewal = _heartbeat.start(self._renew, self.ttl / 3)
        return True

    # -- holding -----------------------------------------------------------------------

    def _renew(self) -> bool:
        """One heartbeat: extend the lease; False (stop renewing) once it is lost."""
        token = self.token
        if token is None:
            return False
        sent = time.monotonic()
        try:
            still = self._count(_EXTEND, [token, _ms(self.ttl)], "renew")
        except BackendUnavailable as exc:
            return self._renewed(token, sent, 0, exc)
        return self._renewed(token, sent, still, None)

    def _renewed(self, token: str, sent: float, still: int,
                 error: BackendUnavailable | None) -> bool:
        """Book one heartbeat's outcome; False once the lease is known to be lost."""
        if error is not None:
            signals.lock_renew_failed.send(type(self), name=self.label, token=token,
                                           fencing_token=self._fence_value())
            if time.monotonic() >= self._lease_ends:
                self._mark_lost(f"could not renew it before the lease ran out ({error})")
                return False
            return True
        if still < len(self.names):
            self._mark_lost("the lease expired or another owner took it over")
            return False
        self._lease_ends = sent + self.ttl
        return True

    def _mark_lost(self, reason: str) -> None:
        if self._lost_reason is not None:
            return
        self._lost_reason = reason
        logger.error("lock %r lost while held (fencing token %s): %s",
                     self.label, self._fence_value(), reason)
        signals.lock_lost.send(type(self), name=self.label, token=self.token or "",
                               fencing_token=self._fence_value())

    def _lost_error(self) -> LockLost:
        error = LockLost(f"lock {self.label!r} was lost while held: {self._lost_reason}")
        error.name = self.label  # type: ignore[attr-defined]
        return error

    def _not_owned(self, action: str) -> LockNotOwned:
        error = LockNotOwned(f"cannot {action} lock {self.label!r}: this instance does not "
                             "hold it (never acquired, already released, or the lease ended "
                             "and another owner may hold it now)")
        error.name = self.label  # type: ignore[attr-defined]
        return error

    def extend(self, ttl: float | None = None) -> None:
        """Reset the remaining lease to ``ttl`` seconds (default: the lock's ttl).

        No limit on how often. Raises :class:`LockNotOwned` when the lock is no longer ours;
        another owner's lease is never touched.
        """
        seconds = self.ttl if ttl is None else _check_seconds("ttl", ttl, allow_zero=False)
        token = self.token
        if token is None:
            raise self._not_owned("extend")
        sent = time.monotonic()
        self._after_extend(self._count(_EXTEND, [token, _ms(seconds)], "extend"), sent, seconds)

    def _after_extend(self, extended: int, sent: float, seconds: float) -> None:
        if extended < len(self.names):
            self._mark_lost("extend found the lease gone or taken over")
            raise self._not_owned("extend")
        self._lease_ends = sent + seconds

    def owned(self) -> bool:
        """True when Redis still holds this instance's token for every name (one read)."""
        token = self.token
        if token is None:
            return False
        mine = (token + "|").encode()
        try:
            results = []
            for client in self._clients():
                try:
                    values = client.mget(self._held_keys)
                except redis.RedisError:
                    if not self._quorum:
                        raise
                    continue
                results.append(all(v is not None and bytes(v).startswith(mine) for v in values))
        except redis.RedisError as exc:
            raise self._unavailable("check", exc) from exc
        return sum(results) >= self._majority()

    # -- releasing ---------------------------------------------------------------------

    def _stop_heartbeat(self) -> None:
        renewal, self._renewal = self._renewal, None
        if renewal is not None:
            renewal.stop()

    def release(self) -> None:
        """Give the lock up. Only ever deletes keys that still hold this instance's token.

        Raises :class:`LockNotOwned` when the lock is not (or no longer) ours.
        """
        token = self.token
        if token is None:
            raise self._not_owned("release")
        self._stop_heartbeat()
        try:
            released = self._count(_RELEASE, [token], "release")
        finally:
            self.token = None
            _wakeups.notify(self._held_keys)
        self._after_release(released)

    def _after_release(self, released: int) -> None:
        if released < len(self.names):
            self._mark_lost("release found the lease gone or taken over")
            raise self._not_owned("release")

    def _exit(self, exc: BaseException | None) -> None:
        lost_before = self.lost
        try:
            self.release()
        except (LockNotOwned, BackendUnavailable) as release_error:
            self._after_exit(exc, lost_before, release_error)
            return
        self._after_exit(exc, lost_before, None)

    def _after_exit(self, exc: BaseException | None, lost_before: bool,
                    release_error: Exception | None) -> None:
        """What leaving a ``with`` block raises, given how the release went."""
        if release_error is not None:
            if exc is not None:  # never mask the body's own exception
                logger.error("lock %r: release after a failed block also failed: %s",
                             self.label, release_error)
                return
            if isinstance(release_error, BackendUnavailable) and not lost_before:
                raise release_error
            raise self._lost_error() from release_error
        if lost_before and exc is None:
            raise self._lost_error()

    def __enter__(self) -> Any:
        if not self.acquire():
            raise self._not_acquired()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._exit(exc)

    def _not_acquired(self) -> LockNotAcquired:
        error = LockNotAcquired(f"lock {self.label!r} is held by another owner; gave up after "
                                f"waiting {self.wait:g}s")
        error.name = self.label  # type: ignore[attr-defined]
        return error

    # -- asyncio -----------------------------------------------------------------------

    async def _aattempt(self, token: str) -> _Attempt:
        clients = self._async_clients()
        keys_, args = self._acquire_call(token)
        lua = scripts.script(_ACQUIRE)
        started = time.monotonic()

        send = self._aacquire_and_wait if self.min_replicas else lua.acall

        async def call(client: Any) -> Any:
            try:
                try:
                    return await send(client, keys_, args)
                except redis.TimeoutError:  # SPEC D4, as in _attempt
                    return await send(client, keys_, args)
            except redis.RedisError as exc:
                if not self._quorum:
                    await self._arelease_quietly(token)
                    raise self._unavailable("acquire", exc) from exc
                logger.warning("lock %r: quorum member unavailable during acquire: %s",
                               self.label, exc)
                return None

        replies = list(await asyncio.gather(*(call(c) for c in clients)))
        if not self._quorum:
            attempt = _parse_acquire(replies[0])
            if self._replicas_missing(attempt):
                await self._arelease_quietly(token)
                raise self._replicas_error()
            attempt.validity = self.ttl
            self._lease_ends = started + self.ttl
            return attempt
        if sum(1 for r in replies if r is not None) < self._majority():
            await self._arelease_quietly(token)
            raise self._unavailable("acquire", RuntimeError("too few quorum members answered"))
        attempt = self._decide_quorum(replies, started)
        if attempt.ok:
            floor = scripts.script(_FENCE_FLOOR)
            written = await asyncio.gather(
                *(floor.acall(c, self._fence_keys, [*attempt.fences, self._fencing_ttl_ms])
                  for c in clients),
                return_exceptions=True,
            )
            ok = sum(1 for w in written if not isinstance(w, BaseException))
            attempt = self._settle_quorum(attempt, ok, started)
        if not attempt.ok:
            await self._arelease_quietly(token)
        return attempt

    async def _arelease_quietly(self, token: str) -> None:
        for client in self._async_clients():
            with contextlib.suppress(redis.RedisError):
                await scripts.script(_RELEASE).acall(client, self._held_keys, [token])

    async def _acount(self, script: str, args: list[Any], action: str) -> int:
        lua = scripts.script(script)
        replies = await asyncio.gather(
            *(lua.acall(c, self._held_keys, args) for c in self._async_clients()),
            return_exceptions=True,
        )
        results = [int(r) for r in replies if not isinstance(r, BaseException)]
        errors = [r for r in replies if isinstance(r, redis.RedisError)]
        others = [r for r in replies if isinstance(r, BaseException)
                  and not isinstance(r, redis.RedisError)]
        if others:
            raise others[0]
        return self._count_result(results, errors[0] if errors else None, action)

    async def aacquire(self, wait: float | None = None) -> bool:
        """Async twin of :meth:`acquire` (heartbeat: an asyncio task on this loop)."""
        wait = self.wait if wait is None else _check_seconds("wait", wait, allow_zero=True)
        token = self._begin()
        deadline = time.monotonic() + wait
        delay = _MIN_DELAY
        try:
            while True:
                attempt = await self._aattempt(token)
                if attempt.ok:
                    break
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    self.token = None
                    self._report_wait(deadline - wait, acquired=False)
                    return False
                await asyncio.sleep(self._backoff(attempt, delay, remaining))
                delay = min(delay * 2, _MAX_DELAY)
        except BaseException:
            self.token = None
            raise
        self._won(token, attempt)
        if delay > _MIN_DELAY:  # it slept at least once: the lock was held when asked
            self._report_wait(deadline - wait, acquired=True)
        if self.auto_renew:
            self._task = asyncio.get_running_loop().create_task(self._aheartbeat())
        return True

    async def _aheartbeat(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            token = self.token
            if token is None:
                return
            sent = time.monotonic()
            try:
                still = await self._acount(_EXTEND, [token, _ms(self.ttl)], "renew")
            except BackendUnavailable as exc:
                if not self._renewed(token, sent, 0, exc):
                    return
                continue
            if not self._renewed(token, sent, still, None):
                return

    async def _astop_heartbeat(self) -> None:
        task, self._task = self._task, None
        if task is not None and task is not asyncio.current_task():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def aextend(self, ttl: float | None = None) -> None:
        """Async twin of :meth:`extend`."""
        seconds = self.ttl if ttl is None else _check_seconds("ttl", ttl, allow_zero=False)
        token = self.token
        if token is None:
            raise self._not_owned("extend")
        sent = time.monotonic()
        extended = await self._acount(_EXTEND, [token, _ms(seconds)], "extend")
        self._after_extend(extended, sent, seconds)

    async def arelease(self) -> None:
        """Async twin of :meth:`release`."""
        token = self.token
        if token is None:
            raise self._not_owned("release")
        await self._astop_heartbeat()
        try:
            released = await self._acount(_RELEASE, [token], "release")
        finally:
            self.token = None
        self._after_release(released)

    async def __aenter__(self) -> Any:
        if not await self.aacquire():
            raise self._not_acquired()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        lost_before = self.lost
        try:
            await self.arelease()
        except (LockNotOwned, BackendUnavailable) as release_error:
            self._after_exit(exc, lost_before, release_error)
            return
        self._after_exit(exc, lost_before, None)


class Lock(_Base):
    """A leased, owner-checked, fenced lock on one name.

    ``Lock(name, ttl=30, *, wait=0, auto_renew=True)``. Guarantees:

    * acquire is one round trip (one script: ``SET NX PX`` plus the fencing token);
    * :attr:`token` is fresh and random (128 bits) for every acquisition, and
      :attr:`fencing_token` is larger than that of every earlier acquisition of the name;
    * release/extend only ever touch the key while it holds this acquisition's token;
    * with ``auto_renew`` a heartbeat extends the lease every ``ttl/3``; when it finds the
      lease lost, leaving the ``with`` block raises :class:`LockLost`.

    One instance is one holder: create a Lock per thread or task (they are cheap).
    """

    def __init__(
        self,
        name: str,
        ttl: float | None = None,
        *,
        wait: float = 0,
        auto_renew: bool = True,
        namespace: str = DEFAULT_NAMESPACE,
        connection: str | None = None,
        quorum: Sequence[str] | None = None,
        owner: str | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
    ) -> None:
        super().__init__([_check_name(name)], ttl, wait=wait, auto_renew=auto_renew,
                         namespace=namespace, connection=connection, quorum=quorum,
                         owner=owner, min_replicas=min_replicas,
                         replica_timeout=replica_timeout)

    @property
    def name(self) -> str:
        return self.names[0]

    @property
    def fencing_token(self) -> int | None:
        """The fencing token of the current (or last) acquisition; None before the first."""
        return self.fencing_tokens.get(self.names[0])

    def __enter__(self) -> Lock:
        return super().__enter__()

    async def __aenter__(self) -> Lock:
        return await super().__aenter__()


class MultiLock(_Base):
    """All-or-nothing over several names of one namespace, in one script.

    Either every name is taken with one token (and one fencing token each, in
    :attr:`fencing_tokens`), or none is; there is no partial hold, so no deadlock. The
    names share the namespace's hash tag, so this works unchanged on Redis Cluster.
    """

    def __init__(
        self,
        names: Iterable[str],
        ttl: float | None = None,
        *,
        wait: float = 0,
        auto_renew: bool = True,
        namespace: str = DEFAULT_NAMESPACE,
        connection: str | None = None,
        quorum: Sequence[str] | None = None,
        owner: str | None = None,
        min_replicas: int = 0,
        replica_timeout: float = 0.1,
    ) -> None:
        if isinstance(names, str):
            raise TypeError("MultiLock takes a list of names, not one str (use Lock)")
        unique = sorted({_check_name(n) for n in names})
        if not unique:
            raise ValueError("MultiLock needs at least one name")
        super().__init__(unique, ttl, wait=wait, auto_renew=auto_renew, namespace=namespace,
                         connection=connection, quorum=quorum, owner=owner,
                         min_replicas=min_replicas, replica_timeout=replica_timeout)

    @property
    def fencing_token(self) -> int | None:
        """The largest fencing token of the current acquisition."""
        return self._fence_value()

    def __enter__(self) -> MultiLock:
        return super().__enter__()

    async def __aenter__(self) -> MultiLock:
        return await super().__aenter__()
