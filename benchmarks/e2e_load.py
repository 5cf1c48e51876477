"""A lean closed-loop HTTP load for the end-to-end benchmark: one event loop, raw sockets.

The soak's load generator (:mod:`soak.load`) checks every answer and spends a few hundred
microseconds of Python per request (``http.client``, one thread per device). On a two-core
machine that CPU comes out of the app's share and dilutes what the app itself costs. This
one keeps the same devices, mix, cookies and alternation between stacks, but sends
pre-formatted requests from one ``selectors`` loop and reads only each answer's status line
and length: a few tens of microseconds per request, so what the benchmark compares is the
app and its Redis, as in production, where the load comes from other machines.

Before the common start, devices sign in to every stack over the keep-alive connections
they will use, spread evenly over each server's worker processes (:func:`balanced`); then
each sends one request at a time to the stack of the current slot. It
writes the same events as :mod:`soak.load` (``k``, ``s``, ``r``, ``st``, ``tg``), so the
benchmark counts both alike.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import socket
import time
import urllib.parse
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak import config

CONNECT_TIMEOUT = 10.0
BALANCE_SECONDS = 20.0
HEAD_END = b"\r\n\r\n"


@dataclass
class LeanSpec:
    ports: list[int]
    duration: float
    proc: int
    devices: int
    out: str
    mix: dict[str, int]
    slot_seconds: float = 1.0
    workers: int = 4  # the server's worker processes, which the devices are spread over
    cpus: set[int] | None = None  # the cores to run on (None: any)
    seed: int = 0
    t0: float = 0.0
    t_stop: float = 0.0
    cookies: dict[tuple[int, int], str] = field(default_factory=dict)


def exchange(sock: socket.socket, data: bytes) -> tuple[int, bytes]:
    """Send one request on a blocking socket; (status, lower-cased head) of its answer."""
    sock.sendall(data)
    buffer = b""
    while (done := answer_length(buffer)) is None:
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise ConnectionError("the server closed the connection before answering")
        buffer += chunk
    return done[0], buffer[:buffer.find(HEAD_END)].lower()


def header(head: bytes, name: bytes) -> str:
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return ""
    stop = head.find(b"\r\n", at + 2)
    return head[at + len(name) + 3: stop if stop >= 0 else len(head)].strip().decode()


def sign_in(sock: socket.socket, user: int) -> tuple[str, str]:
    """Sign ``user`` in over ``sock``: (session cookie, pid of the worker that answered)."""
    body = urllib.parse.urlencode({"username": config.username(user),
                                   "password": config.PASSWORD}).encode()
    status, head = exchange(sock, (
        "POST /signin HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        "Content-Type: application/x-www-form-urlencoded\r\n"
        f"Content-Length: {len(body)}\r\n\r\n").encode() + body)
    cookie = header(head, b"set-cookie")
    if status != 200 or not cookie.startswith("sessionid="):
        raise RuntimeError(f"sign-in gave {status} and no session cookie")
    return cookie.split(";", 1)[0].split("=", 1)[1].strip('"'), header(head, b"x-soak-worker")


def balanced(port: int, devices: int, workers: int) -> list[tuple[socket.socket, str]]:
    """``devices`` signed-in keep-alive connections to ``port``, spread evenly over its
    ``workers`` (gunicorn binds a connection to the worker that accepted it, and which one
    accepts is luck: 16 connections left to luck put most of the load on one or two worker
    processes, each held to one core by its GIL, and the benchmark would measure the luck).
    Each device signs in once; a connection that lands on a worker which has its share
    already is closed and opened again a moment later (asking ``GET /me``, which creates
    no session: a user's sessions are capped); after ``BALANCE_SECONDS`` the rest are kept
    wherever they land."""
    share = -(-devices // workers)
    held: dict[str, int] = {}
    out: list[tuple[socket.socket, str]] = []
    deadline = time.monotonic() + BALANCE_SECONDS
    cookie = ""
    while len(out) < devices:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_TIMEOUT)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if not cookie:
            cookie, worker = sign_in(sock, len(out) % config.USERS)
        else:
            worker = whose(sock, cookie)
        if held.get(worker, 0) >= share and time.monotonic() < deadline:
            sock.close()
            time.sleep(0.002)  # a moment for the other workers to come back to accept()
            continue
        held[worker] = held.get(worker, 0) + 1
        out.append((sock, cookie))
        cookie = ""
    return out


def whose(sock: socket.socket, cookie: str) -> str:
    """The pid of the worker that serves ``sock`` (a signed-in ``GET /me``)."""
    status, head = exchange(sock, ("GET /me HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                                   f"Cookie: sessionid={cookie}\r\n\r\n").encode())
    if status != 200:
        raise RuntimeError(f"GET /me gave {status} to a device just signed in")
    return header(head, b"x-soak-worker")


class Requests:
    """Formats each route's request bytes; only what changes per request is formatted."""

    def __init__(self, spec: LeanSpec, device: int) -> None:
        self.spec = spec
        self.device = device
        self.user = device % config.USERS
        self.routes = config.rate_routes()
        self.agent = f"soak/{spec.proc}.{device}"
        self.orders = 0

    def build(self, kind: str, cookie: str, rng: random.Random) -> bytes:
        head = (f"Host: 127.0.0.1\r\nUser-Agent: {self.agent}\r\n"
                f"Cookie: sessionid={cookie}\r\n")
        if kind == "me":
            return f"GET /me HTTP/1.1\r\n{head}\r\n".encode()
        if kind == "cached":
            return f"GET /cached/{rng.randrange(config.CACHE_KEYS)} HTTP/1.1\r\n{head}\r\n".encode()
        if kind == "order":
            self.orders += 1
            key = f"p{self.spec.proc}d{self.device}n{self.orders}-{rng.getrandbits(48):x}"
            body = json.dumps({"key": key, "user": self.user}).encode()
            return (f"POST /orders HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
                    f"Idempotency-Key: {key}\r\nContent-Length: {len(body)}\r\n\r\n"
                    ).encode() + body
        path = self.routes[kind][0]
        bucket = int((time.time() - self.spec.t0) // config.BUCKET_SECONDS)
        return (f"GET {path} HTTP/1.1\r\n{head}{config.BUCKET_HEADER}: {kind}-{bucket}\r\n"
                "\r\n").encode()


def answer_length(buffer: bytes) -> tuple[int, int] | None:
    """(status, bytes of the whole answer) once ``buffer`` holds a complete answer."""
    end = buffer.find(HEAD_END)
    if end < 0:
        return None
    head = buffer[:end].lower()
    status = int(buffer[9:12])
    length = header(head, b"content-length")
    if length:
        total = end + 4 + int(length)
        return (status, total) if len(buffer) >= total else None
    if b"transfer-encoding: chunked" in head:
        last = buffer.find(b"\r\n0\r\n\r\n", end)
        return (status, last + 7) if last >= 0 else None
    return status, end + 4


class Device:
    """One signed-in device: a keep-alive connection per stack, one request at a time."""

    def __init__(self, spec: LeanSpec, index: int, selector: selectors.BaseSelector,
                 events: list[tuple[Any, ...]]) -> None:
        self.spec = spec
        self.index = index
        self.selector = selector
        self.events = events
        self.rng = random.Random(spec.seed * 1000 + spec.proc * 100 + index)
        self.requests = Requests(spec, index)
        self.socks: dict[int, socket.socket] = {}
        self.buffer = b""
        self.target = 0
        self.kind = ""
        self.sent = 0.0
        self.actions = list(spec.mix)
        self.weights = [spec.mix[a] for a in self.actions]

    def connect(self, target: int, sock: socket.socket | None = None) -> socket.socket:
        """Use ``sock`` (signed in already) or open a new connection to ``target``."""
        if sock is None:
            sock = socket.create_connection(("127.0.0.1", self.spec.ports[target]),
                                            timeout=CONNECT_TIMEOUT)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.setblocking(False)
        self.selector.register(sock, selectors.EVENT_READ, self)
        self.socks[target] = sock
        return sock

    def drop(self, target: int) -> None:
        sock = self.socks.pop(target, None)
        if sock is not None:
            self.selector.unregister(sock)
            sock.close()

    def send_next(self, now: float) -> None:
        """The next request, to the stack of the slot ``now`` falls in."""
        self.target = int((now - self.spec.t0) // self.spec.slot_seconds) % len(self.spec.ports)
        sock = self.socks.get(self.target) or self.connect(self.target)
        self.kind = self.rng.choices(self.actions, self.weights)[0]
        data = self.requests.build(self.kind, self.spec.cookies[(self.index, self.target)],
                                   self.rng)
        self.buffer = b""
        self.sent = time.time()
        try:
            sock.sendall(data)  # a few hundred bytes: the socket buffer takes them at once
        except OSError:
            self.failed()

    def failed(self) -> None:
        """No answer: counted as an error; the device reconnects and goes on."""
        self.events.append((self.kind, self.target, self.sent, time.time(), 0))
        self.drop(self.target)
        time.sleep(0.01)
        if time.time() < self.spec.t_stop:
            self.send_next(time.time())

    def readable(self, sock: socket.socket) -> None:
        try:
            chunk = sock.recv(1 << 16)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if sock is not self.socks.get(self.target):  # an idle connection closed by the server
            if not chunk:
                for target, mine in list(self.socks.items()):
                    if mine is sock:
                        self.drop(target)
            return
        if not chunk:
            self.failed()
            return
        self.buffer += chunk
        done = answer_length(self.buffer)
        if done is None:
            return
        status = done[0]
        now = time.time()
        self.events.append((self.kind, self.target, self.sent, now, status))
        if b"\r\nconnection: close" in self.buffer[:self.buffer.find(HEAD_END)].lower():
            self.drop(self.target)
        if now < self.spec.t_stop:
            self.send_next(now)


def lean_process(spec: LeanSpec, ready: Any, start: Any) -> None:
    """One load process: sign every device in to every stack, wait for the common start,
    run until the stop, then write the events."""
    if spec.cpus:
        os.sched_setaffinity(0, spec.cpus)
    socks: dict[tuple[int, int], socket.socket] = {}
    for target, port in enumerate(spec.ports):
        for index, (sock, cookie) in enumerate(balanced(port, spec.devices, spec.workers)):
            socks[(index, target)] = sock
            spec.cookies[(index, target)] = cookie
    ready.wait(120)  # every process signed in
    ready.wait(120)  # the start time is set
    spec.t0 = start.value
    spec.t_stop = spec.t0 + spec.duration
    selector = selectors.DefaultSelector()
    events: list[tuple[Any, ...]] = []
    devices = [Device(spec, i, selector, events) for i in range(spec.devices)]
    for device in devices:
        for target in range(len(spec.ports)):
            device.connect(target, socks[(device.index, target)])
    time.sleep(max(0.0, spec.t0 - time.time()))
    for device in devices:
        device.send_next(time.time())
    while time.time() < spec.t_stop:
        for key, _mask in selector.select(timeout=0.05):
            key.data.readable(key.fileobj)
    selector.close()
    multi = len(spec.ports) > 1
    with Path(spec.out).open("w") as f:
        for kind, target, sent, received, status in events:
            event = {"p": spec.proc, "k": kind, "s": sent, "r": received, "st": status}
            if multi:
                event["tg"] = target
            f.write(json.dumps(event, separators=(",", ":")) + "\n")


def start_lean_load(owned: Any, ports: list[int], seconds: float, outdir: Path, *,
                    mix: dict[str, int], procs: int = 1, devices: int = 16,
                    workers: int = 4, slot_seconds: float = 1.0,
                    cpus: set[int] | None = None) -> Any:
    """Start the lean load against ``ports`` (alternating every ``slot_seconds`` when there
    are several); returns at the common start, as :func:`soak.run.start_load` does."""
    from soak.run import start_together

    outs = [outdir / f"lean-{i}.jsonl" for i in range(procs)]
    specs = [LeanSpec(ports=list(ports), duration=seconds, proc=i, devices=devices // procs,
                      out=str(out), mix=dict(mix), slot_seconds=slot_seconds, workers=workers,
                      cpus=cpus, seed=int.from_bytes(os.urandom(2), "big"))
             for i, out in enumerate(outs)]
    return start_together(owned, lean_process, specs, outs, seconds)
