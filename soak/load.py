"""The load generator: closed-loop "devices" in several processes, every answer recorded.

Each load process runs ``threads`` devices; device ``t`` of every process belongs to user
``t``, so each user is signed in from one device per process (and so, usually, through
several server workers). A device sends one request at a time on a keep-alive connection
and picks its next request from a weighted mix:

* ``me``: ``GET /me`` with its session cookie (signs in again when answered 401);
* ``rl_*`` / ``api_rule``: the rate-limited routes, identity = the current bucket
  (``X-Soak-Bucket``, shared by every process);
* ``cached`` / ``cached_swr``: ``get_or_set`` routes (100 ms compute);
* ``order``: ``POST /orders`` with ``Idempotency-Key`` = ``u<user>-<slot>``: every device of
  a user sends the same key in the same second (concurrent duplicates across workers),
  retries it after 409 / 503 / no answer until it gets the stored answer, and later replays
  keys it already has, to compare the bytes;
* ``logout``: the user's device in process 0 calls ``logout_everywhere`` now and then.

Every loop is bounded by the stop time; each request by the client timeout.
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import json
import random
import threading
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from soak import config

CLIENT_TIMEOUT = 30.0  # seconds; a request without an answer by then is "unanswered"
ORDER_SLOT = 0.5  # seconds: devices of one user share the order key of the current slot
RETRY_CAP = 2.0  # seconds: the longest a device waits before retrying an order key

SOAK_MIX = {"me": 18, "rl_fixed": 7, "rl_sliding": 7, "rl_gcra": 7, "api_rule": 7,
            "cached": 12, "cached_swr": 12, "order": 16}
BENCH_MIX = {"me": 20, "rl_fixed": 10, "rl_sliding": 10, "rl_gcra": 10, "api_rule": 10,
             "cached": 15, "order": 10}


@dataclass
class LoadSpec:
    port: int
    duration: float
    proc: int
    threads: int
    out: str
    mode: str = "soak"  # "soak" (check everything) or "bench" (throughput only)
    logout_period: float = 6.0
    seed: int = 0
    mix: dict[str, int] = field(default_factory=dict)
    # Several servers (the end-to-end benchmark): every device switches between them
    # every ``slot_seconds``, all devices alike, so both see the same moments of the machine.
    other_ports: list[int] = field(default_factory=list)
    slot_seconds: float = 1.0
    # Set when every load process is ready: the same start for all of them.
    t0: float = 0.0  # time.time() at the start (buckets and order slots count from it)
    t_stop: float = 0.0


@dataclass
class Answer:
    event: dict[str, Any]
    response: http.client.HTTPResponse | None
    body: bytes

    def header(self, name: str) -> str | None:
        return self.response.getheader(name) if self.response is not None else None


def cookie_id(cookie: str | None) -> str | None:
    return hashlib.sha1(cookie.encode()).hexdigest()[:12] if cookie else None


class Device:
    def __init__(self, spec: LoadSpec, index: int, events: list[dict[str, Any]]) -> None:
        self.spec = spec
        self.index = index
        self.user = index % config.USERS
        self.events = events
        self.rng = random.Random(spec.seed * 1000 + spec.proc * 100 + index)
        self.conn: http.client.HTTPConnection | None = None
        self.cookie: str | None = None
        self.ports = [spec.port, *spec.other_ports]
        self.target = 0  # index into ports
        self.saved: dict[int, tuple[Any, str | None]] = {}  # other targets' (conn, cookie)
        self.pending: dict[str, float] = {}  # order key -> when to retry it
        self.resolved: dict[str, bytes] = {}  # order key -> the body we were given
        self.sent_slots: set[int] = set()
        self.next_logout = spec.t0 + spec.logout_period * (1 + self.rng.random())
        mix = spec.mix or (BENCH_MIX if spec.mode == "bench" else SOAK_MIX)
        self.actions = list(mix)
        self.weights = [mix[a] for a in self.actions]
        self.routes = config.rate_routes()

    # --- HTTP ---------------------------------------------------------------------------

    def send(self, kind: str, method: str, path: str, body: bytes | None = None,
             headers: dict[str, str] | None = None, **extra: Any) -> Answer:
        """One request: its event (``st`` 0 when no answer came), headers and body."""
        hdrs = {"Host": "127.0.0.1", "User-Agent": f"soak/{self.spec.proc}.{self.index}"}
        if self.cookie:
            hdrs["Cookie"] = f"sessionid={self.cookie}"
        if headers:
            hdrs.update(headers)
        event: dict[str, Any] = {"p": self.spec.proc, "d": self.index, "u": self.user,
                                 "k": kind, **extra}
        if len(self.ports) > 1:
            event["tg"] = self.target
        if self.conn is None:
            self.conn = http.client.HTTPConnection("127.0.0.1", self.ports[self.target],
                                                   timeout=CLIENT_TIMEOUT)
        event["s"] = time.time()
        try:
            self.conn.request(method, path, body=body, headers=hdrs)
            response = self.conn.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as exc:
            event["r"] = time.time()
            event["st"] = 0
            event["err"] = f"{type(exc).__name__}: {exc}"[:200]
            with contextlib.suppress(Exception):
                self.conn.close()
            self.conn = None
            self.events.append(event)
            return Answer(event, None, b"")
        event["r"] = time.time()
        event["st"] = response.status
        event["el"] = _float(response.getheader("X-Soak-Elapsed"))
        event["w"] = _int(response.getheader("X-Soak-Worker"))
        self._take_cookie(response, event)
        if response.getheader("Connection", "").lower() == "close":
            self.conn.close()
            self.conn = None
        self.events.append(event)
        return Answer(event, response, data)

    def _take_cookie(self, response: http.client.HTTPResponse, event: dict[str, Any]) -> None:
        for name, value in response.getheaders():
            if name.lower() != "set-cookie" or not value.startswith("sessionid="):
                continue
            cookie = value.split(";", 1)[0].split("=", 1)[1].strip('"')
            self.cookie = cookie or None
            event["set"] = cookie_id(self.cookie) or "-"

    # --- the mix ----------------------------------------------------------------------

    def switch(self, now: float) -> None:
        """Move to the target of the current slot, keeping each target's connection and
        session cookie."""
        target = int((now - self.spec.t0) // self.spec.slot_seconds) % len(self.ports)
        if target != self.target:
            self.saved[self.target] = (self.conn, self.cookie)
            self.conn, self.cookie = self.saved.pop(target, (None, None))
            self.target = target

    def run(self) -> None:
        while time.time() < self.spec.t_stop:
            now = time.time()
            if len(self.ports) > 1:
                self.switch(now)
            if self.cookie is None:
                self.signin()
                continue
            due = [k for k, t in self.pending.items() if t <= now]
            if due:
                self.order(due[0])
                continue
            if (self.spec.mode == "soak" and self.spec.proc == 0
                    and now >= self.next_logout):
                self.next_logout = now + self.spec.logout_period * (0.5 + self.rng.random())
                self.logout_everywhere()
                continue
            action = self.rng.choices(self.actions, self.weights)[0]
            handler = getattr(self, f"do_{action}", None)
            if handler is not None:
                handler()
            else:
                self.rate_limited(action)
        for conn in [self.conn, *(c for c, _ in self.saved.values())]:
            if conn is not None:
                conn.close()

    def signin(self) -> None:
        body = urllib.parse.urlencode({"username": config.username(self.user),
                                       "password": config.PASSWORD}).encode()
        self.cookie = None
        event = self.send("signin", "POST", "/signin", body,
                          {"Content-Type": "application/x-www-form-urlencoded"}).event
        if event["st"] != 200:
            self.cookie = None
            time.sleep(min(0.5, max(0.0, self.spec.t_stop - time.time())))
        event["ck"] = cookie_id(self.cookie)

    def do_me(self) -> None:
        ck = cookie_id(self.cookie)
        answer = self.send("me", "GET", "/me", ck=ck)
        event = answer.event
        if event["st"] == 200:
            event["auth"] = json.loads(answer.body)["user"]
        elif event["st"] == 401:
            self.cookie = None

    def logout_everywhere(self) -> None:
        ck = cookie_id(self.cookie)
        answer = self.send("logout", "POST", "/logout-everywhere", b"", ck=ck)
        event = answer.event
        if event["st"] == 200:
            event["del"] = json.loads(answer.body)["deleted"]
        elif event["st"] == 401:
            self.cookie = None

    def rate_limited(self, name: str) -> None:
        path = self.routes[name][0]
        bucket = f"{name}-{int((time.time() - self.spec.t0) // config.BUCKET_SECONDS)}"
        answer = self.send(name, "GET", path, headers={config.BUCKET_HEADER: bucket}, b=bucket)
        if answer.response is not None:
            answer.event["rem"] = _int(answer.header("RateLimit-Remaining"))

    def do_cached(self, route: str = "cached") -> None:
        n = self.rng.randrange(config.CACHE_KEYS)
        answer = self.send(route, "GET", f"/{route.replace('_', '-')}/{n}", n=n)
        if answer.event["st"] == 200:
            value = json.loads(answer.body)
            answer.event["ca"] = value["computed_at"]
            answer.event["run"] = value["run"]

    def do_cached_swr(self) -> None:
        self.do_cached("cached_swr")

    def do_order(self) -> None:
        if self.spec.mode == "bench":
            self.order(uuid.uuid4().hex)
            return
        slot = int((time.time() - self.spec.t0) // ORDER_SLOT)
        if slot not in self.sent_slots:
            self.sent_slots.add(slot)
            self.order(f"u{self.user}-{slot}")
        elif self.resolved and self.rng.random() < 0.25:
            self.order(self.rng.choice(list(self.resolved)))  # a replay: compare the bytes
        else:
            self.do_me()

    def order(self, key: str) -> None:
        body = json.dumps({"key": key, "user": self.user}).encode()
        answer = self.send("order", "POST", "/orders", body,
                           {"Content-Type": "application/json", "Idempotency-Key": key},
                           key=key, ck=cookie_id(self.cookie))
        event, status = answer.event, answer.event["st"]
        self.pending.pop(key, None)
        if self.spec.mode == "bench":
            return
        if status == 201:
            event["rep"] = answer.header("Idempotent-Replayed") == "true"
            event["loc"] = answer.header("Location")
            event["ct"] = answer.header("Content-Type")
            event["body"] = answer.body.decode()
            event["run"] = json.loads(answer.body)["order"]
            self.resolved.setdefault(key, answer.body)
            return
        if status in (0, 409, 503):
            retry = _float(answer.header("Retry-After"))
            self.pending[key] = time.time() + min(retry or 0.5, RETRY_CAP)
        elif status == 400 and b"idempotency_scope_missing" in answer.body:
            self.cookie = None  # signed out meanwhile: sign in, then retry
            self.pending[key] = time.time()
        if status not in (201, 409, 503, 0):
            event["body"] = answer.body.decode(errors="replace")[:300]


def _float(value: str | None) -> float | None:
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


def _int(value: str | None) -> int | None:
    try:
        return int(value) if value is not None else None
    except ValueError:
        return None


def load_process(spec: LoadSpec, ready: Any, start: Any) -> None:
    """Entry point of one load process: wait for the common start, run the devices, then
    write the events."""
    ready.wait(120)  # every process imported and ready
    ready.wait(120)  # the start time is set
    spec.t0 = start.value
    spec.t_stop = spec.t0 + spec.duration
    events_by_device: list[list[dict[str, Any]]] = [[] for _ in range(spec.threads)]
    devices = [Device(spec, i, events_by_device[i]) for i in range(spec.threads)]
    threads = [threading.Thread(target=d.run, daemon=True) for d in devices]
    for t in threads:
        t.start()
    for t in threads:
        t.join(max(0.0, spec.t_stop - time.time()) + CLIENT_TIMEOUT + 5)
    out = Path(spec.out)
    with out.open("w") as f:
        for events in events_by_device:
            for event in list(events):
                f.write(json.dumps(event, separators=(",", ":")) + "\n")
