"""The processes a soak run owns: redis-server, gunicorn / uvicorn, load generators.

Everything binds to 127.0.0.1 on a free port. Every process started here is registered in
one :class:`Owned` list and stopped **by its PID** (SIGTERM, then SIGKILL after a bounded
wait), also on Ctrl-C or a failure; server workers are collected by PID from /proc before
their master is stopped, so none is left behind.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def children_of(pid: int) -> list[int]:
    """Direct children of ``pid`` (Linux /proc), [] when it is gone."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found.extend(int(c) for c in f.read().split())
    return found


def _stat_fields(pid: int) -> list[str] | None:
    """``/proc/<pid>/stat`` after the command name (field 3 on: state, ppid, ...), or None
    when the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system, every thread) ``pid`` and its direct children have used."""
    ticks = 0
    for one in (pid, *children_of(pid)):
        fields = _stat_fields(one)
        if fields is not None:
            ticks += int(fields[11]) + int(fields[12])  # utime, stime
    return ticks / os.sysconf("SC_CLK_TCK")


def stop_pid(pid: int, process: subprocess.Popen[bytes] | None = None,
             grace: float = 10.0) -> None:
    """SIGCONT + SIGTERM, then SIGKILL after ``grace`` seconds; reaps our own children."""
    for sig in (signal.SIGCONT, signal.SIGTERM):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            return
        if process is None and not alive(pid):
            return
        time.sleep(0.05)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    if process is not None:
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)


class Owned:
    """Every process and folder of one run, stopped / removed in reverse order."""

    def __init__(self) -> None:
        self.stoppers: list[Any] = []

    def add(self, stopper: Any) -> Any:
        self.stoppers.append(stopper)
        return stopper

    def stop_all(self) -> None:
        while self.stoppers:
            stopper = self.stoppers.pop()
            try:
                stopper.stop()
            except Exception as exc:  # keep stopping the others
                print(f"soak: stopping {stopper!r} failed: {exc}", file=sys.stderr)


class RedisProcess:
    """A private redis-server with an append-only file (``appendfsync always``), so that a
    restart *from the AOF* loses nothing acknowledged, and a restart in a fresh folder is a
    restart without persistence."""

    def __init__(self, workdir: Path) -> None:
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise RuntimeError("redis-server is not on PATH")
        self.workdir = workdir
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None
        self.generation = 0
        self.dir = self._new_dir()

    def __repr__(self) -> str:
        return f"redis-server :{self.port}"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)

    def _new_dir(self) -> Path:
        self.generation += 1
        path = self.workdir / f"redis-{self.generation}"
        path.mkdir()
        return path

    def start(self) -> None:
        assert self.binary is not None
        self.process = subprocess.Popen(
            [self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "yes", "--appendfsync", "always", "--dir", str(self.dir),
             "--logfile", str(self.dir / "redis.log")],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=self.dir,
            start_new_session=True,  # Ctrl-C reaches us only; we stop it by PID
        )
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server on port {self.port} exited at start")
            try:
                info = self.client().info("persistence")
                if int(info.get("loading", 0)) == 0:
                    return
            except redis.RedisError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"redis-server on port {self.port} did not start")

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def hang(self) -> None:
        os.kill(self.pid, signal.SIGSTOP)

    def wake(self) -> None:
        os.kill(self.pid, signal.SIGCONT)

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)

    def restart_empty(self) -> None:
        """Start again in a fresh folder: every key is gone (no persistence)."""
        self.kill()
        self.dir = self._new_dir()
        self.start()

    def restart_from_aof(self) -> None:
        """Start again in the same folder: the AOF is replayed."""
        self.kill()
        self.start()

    def stop(self) -> None:
        if self.process is not None:
            stop_pid(self.process.pid, self.process, grace=5)


class AppServer:
    """gunicorn (``--workers 4 --threads 4``) or uvicorn (``--workers 4``) serving the soak
    app on loopback. Its stderr goes to ``log``."""

    def __init__(self, kind: str, env: dict[str, str], workdir: Path, *, workers: int = 4,
                 threads: int = 4) -> None:
        self.kind = kind
        self.port = free_port()
        self.workers = workers
        self.log = workdir / f"{kind}.log"
        python = sys.executable
        if kind == "gunicorn":
            args = [python, "-m", "gunicorn", "soak.app.wsgi:application",
                    "--bind", f"127.0.0.1:{self.port}", "--workers", str(workers),
                    "--threads", str(threads), "--worker-class", "gthread",
                    "--keep-alive", "120", "--timeout", "60", "--graceful-timeout", "5",
                    "--backlog", "256"]
        elif kind == "uvicorn":
            args = [python, "-m", "uvicorn", "soak.app.asgi:application",
                    "--host", "127.0.0.1", "--port", str(self.port), "--workers", str(workers),
                    "--timeout-keep-alive", "120", "--no-access-log", "--lifespan", "off",
                    "--timeout-graceful-shutdown", "5"]
        else:
            raise ValueError(f"unknown server {kind!r}")
        self.env = {**os.environ, **env, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
        self._log_file = open(self.log, "ab")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(args, env=self.env, cwd=ROOT, stdin=subprocess.DEVNULL,
                                        stdout=self._log_file, stderr=subprocess.STDOUT,
                                        start_new_session=True)
        self.worker_pids: list[int] = []

    def __repr__(self) -> str:
        return f"{self.kind} :{self.port}"

    def wait_ready(self, timeout: float = 60) -> None:
        """Until every worker answers (the set of worker PIDs is read from /proc)."""
        import http.client

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.kind} exited at start; see {self.log}")
            pids = self.current_workers()
            if len(pids) >= self.workers:
                try:
                    conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
                    conn.request("GET", "/me")
                    conn.getresponse().read()
                    conn.close()
                    self.warm_up()
                    self.worker_pids = self.current_workers()
                    return
                except OSError:
                    pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.kind} did not start within {timeout:.0f} s; see {self.log}")

    def warm_up(self, connections: int = 16) -> None:
        """Sign in and read on many connections at once, so that every worker has imported
        and connected everything before the measured load (a cold first request can take
        seconds on a busy machine)."""
        import http.client
        import threading
        import urllib.parse

        from soak import config

        def one(i: int) -> None:
            with contextlib.suppress(OSError, http.client.HTTPException):
                conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
                body = urllib.parse.urlencode({"username": config.username(i % config.USERS),
                                               "password": config.PASSWORD})
                conn.request("POST", "/signin", body=body,
                             headers={"Content-Type": "application/x-www-form-urlencoded"})
                conn.getresponse().read()
                for path in ("/me", "/cached/0", "/cached-swr/0"):
                    conn.request("GET", path)
                    conn.getresponse().read()
                conn.close()

        for _ in range(2):
            threads = [threading.Thread(target=one, args=(i,)) for i in range(connections)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(60)

    def current_workers(self) -> list[int]:
        """Worker PIDs: the master's children (uvicorn's include its multiprocessing
        helper, which serves nothing; it is harmless to count it)."""
        return sorted(pid for pid in children_of(self.process.pid) if alive(pid))

    def stop(self) -> None:
        workers = self.current_workers()
        stop_pid(self.process.pid, self.process, grace=15)
        for pid in workers:
            if alive(pid):
                stop_pid(pid, grace=5)
        self._log_file.close()


class Workdir:
    """A temporary folder for one run (Redis data, SQLite, run logs), removed at the end."""

    def __init__(self) -> None:
        # In memory where possible: an fsync on a busy shared disk can stall Redis past the
        # socket timeout, which would be the machine's fault, not the app's.
        shm = Path("/dev/shm")
        where = shm if shm.is_dir() and os.access(shm, os.W_OK) else None
        self.path = Path(tempfile.mkdtemp(prefix="rp-soak-", dir=where))

    def __repr__(self) -> str:
        return f"workdir {self.path}"

    def stop(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
