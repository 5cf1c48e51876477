"""Switching session engines during a rolling deploy: real old processes beside new ones.

Each "process" is a real Django process (tests/session_switch_worker.py) on the shared
Redis and a shared SQLite file: Django's cache / cached_db / db engines with their own
settings, this release with ``PREVIOUS_ENGINE``, and the previous release of this package
installed from its git tag into a venv of its own. One browser (a cookie) sends its
requests to one process and then another, as a load balancer would.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from django_redispatterns.sessions import KEY_RE
from django_redispatterns.sessions.keyspace import keys_of
from tests.redis_servers import CACHE_PREFIX, KEY_PREFIX

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "session_switch_worker.py"
OURS = "django_redispatterns.sessions"
DJANGO_ENGINES = ["django.contrib.sessions.backends.cache",
                  "django.contrib.sessions.backends.cached_db",
                  "django.contrib.sessions.backends.db"]


def _installed(module: str, project: str) -> Any:
    try:
        __import__(module.partition(".")[0])
    except ImportError:
        return pytest.param(module, marks=pytest.mark.skip(reason=f"{project} not installed"))
    return module


# django-redis-sessions and django-user-sessions (the `test` extra installs both).
OTHERS = ("redis_sessions.session", "user_sessions.backends.db")
OTHER_ENGINES = [_installed(OTHERS[0], "django-redis-sessions"),
                 _installed(OTHERS[1], "django-user-sessions")]
# The previous release: tag v0.1.0.
PREVIOUS_RELEASE = "984a4a9b55ebab6f899070712bfdd3f0e1e8fe13"
PREVIOUS_VENV = ROOT / ".cache" / "previous-release-venv"

pytestmark = [
    pytest.mark.usefixtures("redis_client"),
    # The previous engines' processes (Django's cache engine on RedisCache, django-redis-
    # sessions, the 0.1.0 release) are configured here with a plain redis:// connection;
    # over rediss:// (the managed stage) they would need their own certificate settings.
    pytest.mark.skipif(os.environ.get("REDIS_URL", "").startswith("rediss://"),
                       reason="the previous engines' test processes speak plain TCP only"),
]


class Process:
    """One web process of the fleet: JSON requests in on stdin, answers out on stdout."""

    def __init__(self, python: str, options: dict[str, Any], log: Path) -> None:
        self.log = log
        self.proc = subprocess.Popen(
            [python, str(WORKER), json.dumps(options)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=log.open("w"), text=True, cwd=log.parent)
        self._answer()  # {"ready": true}, after its migrations

    def _answer(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"worker died: {self.log.read_text()[-3000:]}")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def send(self, request: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        return self._answer()

    def stop(self) -> None:
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


class Browser:
    """A cookie jar of one session cookie; each request goes to the process named."""

    def __init__(self) -> None:
        self.cookie = ""

    def request(self, process: Process, path: str, method: str = "get",
                data: dict[str, str] | None = None) -> dict[str, Any]:
        answer = process.send({"method": method, "path": path, "data": data,
                               "cookie": self.cookie})
        assert answer["status"] == 200, answer
        if "cookie" in answer:
            self.cookie = answer["cookie"]
        body: dict[str, Any] = answer["body"]
        return body

    def login(self, process: Process) -> None:
        self.request(process, "/login/", "post", {"username": "alice", "password": "pw"})

    def whoami(self, process: Process) -> tuple[str | None, str | None]:
        body = self.request(process, "/whoami/")
        return body["user"], body["data"]


Start = Callable[..., Process]


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[dict[str, Process], Path]]:
    """The processes started so far, by settings: each starts once per module (a Django
    process takes seconds to start on a busy machine); they share one database."""
    processes: dict[str, Process] = {}
    yield processes, tmp_path_factory.mktemp("fleet")
    for process in processes.values():
        process.stop()


@pytest.fixture
def start(fleet: tuple[dict[str, Process], Path], redis_url: str) -> Start:
    """A process of the fleet: ``start(engine, sessions=None, python=None)``."""
    processes, folder = fleet

    def _start(engine: str, sessions: dict[str, Any] | None = None,
               python: str | None = None) -> Process:
        spec = json.dumps([engine, sessions, python])
        if spec not in processes:
            previous = (sessions or {}).get("PREVIOUS_ENGINE") or ""
            options = {"engine": engine, "redis_url": redis_url,
                       "db": str(folder / "db.sqlite3"), "key_prefix": KEY_PREFIX,
                       "cache_prefix": CACHE_PREFIX, "sessions": sessions, "user": "alice",
                       "apps": ["user_sessions"] if "user_sessions" in engine + previous else []}
            log = folder / f"worker-{len(processes)}.log"
            try:
                processes[spec] = Process(python or sys.executable, options, log)
            except AssertionError:
                if engine not in OTHERS and previous not in OTHERS:
                    raise
                # A third-party engine that does not start on this stack (its Django
                # support lags): the stack's own engines are still tested.
                pytest.skip(f"{engine} ({previous or 'alone'}) does not start here: "
                            f"{log.read_text().strip().splitlines()[-1]}")
        return processes[spec]

    return _start


def switching(engine: str, mode: str = "primary") -> dict[str, Any]:
    return {"PREVIOUS_ENGINE": engine, "PREVIOUS_ENGINE_MODE": mode}


@pytest.mark.parametrize("engine", DJANGO_ENGINES + OTHER_ENGINES)
def test_read_through_moves_a_signed_in_session_and_keeps_it(start: Start, engine: str) -> None:
    old = start(engine)
    browser = Browser()
    browser.login(old)
    browser.request(old, "/write/before/")
    old_cookie = browser.cookie
    new = start(OURS, switching(engine, "read-through"))

    assert browser.whoami(new) == ("alice", "before")
    assert KEY_RE.fullmatch(browser.cookie), "the cookie is reissued with a key of ours"
    assert new.send({"path": "/sessions/", "cookie": browser.cookie})["body"]["count"] == 1
    browser.request(new, "/write/after/")
    assert browser.whoami(new) == ("alice", "after")

    # A request still carrying the old cookie (sent before the reissued one arrived) finds
    # the moved session, with what was written since: nothing is lost, nothing duplicated.
    late = Browser()
    late.cookie = old_cookie
    assert late.whoami(new) == ("alice", "after")
    assert new.send({"path": "/sessions/", "cookie": browser.cookie})["body"]["count"] == 1


@pytest.mark.parametrize("engine", DJANGO_ENGINES + OTHER_ENGINES)
def test_alternating_old_and_new_processes_lose_nothing(start: Start, engine: str) -> None:
    old = start(engine)
    new = start(OURS, switching(engine))
    browser = Browser()
    browser.login(old)
    for step in range(3):
        browser.request(new, f"/write/new{step}/")
        assert browser.whoami(old) == ("alice", f"new{step}")
        browser.request(old, f"/write/old{step}/")
        assert browser.whoami(new) == ("alice", f"old{step}")
    assert not KEY_RE.fullmatch(browser.cookie), "the old engine's cookie is kept meanwhile"
    assert new.send({"path": "/sessions/", "cookie": browser.cookie})["body"]["count"] == 1

    # Signed in on a new process: an old one reads that session too.
    other = Browser()
    other.login(new)
    other.request(new, "/write/fresh/")
    assert other.whoami(old) == ("alice", "fresh")
    assert new.send({"path": "/sessions/", "cookie": other.cookie})["body"]["count"] == 2


@pytest.mark.parametrize("engine", ["django.contrib.sessions.backends.cache",
                                    "django.contrib.sessions.backends.db"])
def test_logout_everywhere_ends_the_previous_engines_sessions(start: Start, engine: str) -> None:
    old = start(engine)
    new = start(OURS, switching(engine))
    kept, seen, unseen = Browser(), Browser(), Browser()
    for browser in (kept, seen, unseen):
        browser.login(old)
    kept.request(new, "/write/kept/")  # copied into the index by a new process
    seen.request(new, "/write/seen/")

    answer = kept.request(new, "/everywhere/?keep=1")
    assert answer == {"revoked": 1, "complete": False}, "the copy of `seen` went; not all"
    assert seen.whoami(new) == (None, None)
    assert unseen.whoami(new) == (None, None), "ended by the cutoff on its first new load"
    assert seen.whoami(old) == (None, None), "deleted from the previous engine too"
    assert kept.whoami(new) == ("alice", "kept")
    assert kept.whoami(old) == ("alice", "kept")

    # A sign-in after the cutoff, on a new process, is not ended by it.
    again = Browser()
    again.login(new)
    assert again.whoami(new)[0] == again.whoami(old)[0] == "alice"


def test_a_cookie_of_the_previous_engine_is_a_miss_after_the_window(start: Start) -> None:
    engine = DJANGO_ENGINES[0]
    old = start(engine)
    browser = Browser()
    browser.login(old)
    new = start(OURS, {**switching(engine, "read-through"),
                       "PREVIOUS_ENGINE_UNTIL": "2000-01-01T00:00:00+00:00"})
    cookie = browser.cookie
    assert browser.whoami(new) == (None, None)
    browser.cookie = cookie
    assert browser.whoami(old) == ("alice", None), "left alone, not deleted"


@pytest.fixture(scope="session")
def previous_release() -> str:
    """The python of a venv with the previous release installed from its git commit.

    Built once into ``.cache/`` (git-ignored); its dependencies are this venv's (a ``.pth``
    file), so only the package itself is the previous release's.
    """
    python = PREVIOUS_VENV / "bin" / "python"
    PREVIOUS_VENV.parent.mkdir(parents=True, exist_ok=True)
    with open(PREVIOUS_VENV.parent / "previous-release.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one xdist worker builds, the others wait
        _build_previous_release(python)
    version = subprocess.run(
        [str(python), "-c", "import importlib.metadata as m; "
         "print(m.version('django-redispatterns'))"],
        capture_output=True, text=True, cwd="/", check=True).stdout.strip()
    assert version == "0.1.0"
    return str(python)


def _build_previous_release(python: Path) -> None:
    stamp = PREVIOUS_VENV / f".installed-{PREVIOUS_RELEASE}"
    if stamp.exists():
        return
    steps = [
        [sys.executable, "-m", "venv", "--clear", str(PREVIOUS_VENV)],
        [str(python), "-c", "import site, sys; open(site.getsitepackages()[0] + "
         "'/_deps.pth', 'w').write(sys.argv[1])", _purelib()],
        [str(python), "-m", "pip", "install", "--quiet", "--no-deps",
         f"git+file://{ROOT}@{PREVIOUS_RELEASE}"],
    ]
    for step in steps:
        result = subprocess.run(step, capture_output=True, text=True, timeout=300)
        if result.returncode != 0:
            pytest.skip(f"cannot install the previous release ({step[-1]}): "
                        f"{result.stderr[-800:]}")
    stamp.touch()


def _purelib() -> str:
    import sysconfig

    return sysconfig.get_paths()["purelib"]


def test_previous_release_and_this_one_share_sessions(start: Start,
                                                      previous_release: str) -> None:
    previous = start(OURS, python=previous_release)
    current = start(OURS)
    where = previous.send({"path": "/where/"})["body"]["file"]
    assert str(PREVIOUS_VENV) in where, f"the previous process runs {where}"
    browser = Browser()
    browser.login(previous)
    browser.request(previous, "/write/v010/")
    assert browser.whoami(current) == ("alice", "v010")
    browser.request(current, "/write/v020/")
    assert browser.whoami(previous) == ("alice", "v020")

    other = Browser()
    other.login(current)
    assert other.whoami(previous)[0] == "alice"
    assert current.send({"path": "/sessions/", "cookie": other.cookie})["body"]["count"] == 2


def test_a_newer_format_is_a_miss_for_the_previous_release(start: Start, previous_release: str,
                                                           redis_client: Any) -> None:
    """A release that changes the record's format writes it under another field (and a
    higher ``v``): the previous release, which reads ``d``, finds no session."""
    previous = start(OURS, python=previous_release)
    current = start(OURS)
    browser = Browser()
    browser.login(current)
    data_key = keys_of(browser.cookie)[0]
    record = redis_client.hgetall(data_key)
    assert record.get(b"v") == b"1", record
    redis_client.hset(data_key, mapping={"v": "2", "d2": record[b"d"]})
    redis_client.hdel(data_key, "d")
    assert browser.whoami(previous) == (None, None)
    assert browser.whoami(current) == (None, None)
    assert redis_client.hget(data_key, "d2") == record[b"d"], "left as it was"
