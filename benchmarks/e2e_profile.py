"""Where a request's time goes: py-spy samples of the gunicorn workers, attributed per layer.

Each sample (a stack) is charged to the **innermost** frame that belongs to a known layer:
a Redis round trip made by the session engine counts for the session engine, an ORM query
made by ``request.user`` for the ORM. Only samples taken while a request is being handled
(a Django handler frame on the stack) count, so idle threads do not dilute the shares.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

# (layer, substrings of "file:function"); the innermost frame that matches a layer is
# charged. Plumbing (redis-py, django-redis's client, our connection / scripts / keys /
# settings helpers) is never charged itself: its time goes to the layer that called it, and
# is shown apart in the two right-hand columns.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("rate-limit headers (ours)", ("ratelimit/engine.py:add_headers",
                                   "ratelimit/engine.py:_policy_name",
                                   "django_redispatterns/ratelimit/headers.py")),
    ("rate limits (ours)", ("django_redispatterns/ratelimit/", "middleware/ratelimit.py")),
    ("rate limits (django-ratelimit)", ("django_ratelimit/",)),
    ("SessionActivityMiddleware", ("django_redispatterns/middleware/sessions.py",)),
    ("session engine (ours: load, save, activity)", ("django_redispatterns/sessions/",)),
    ("session engine (Django cache engine)", ("contrib/sessions/backends/",)),
    ("SessionMiddleware (save, cookie)", ("contrib/sessions/middleware.py",)),
    ("idempotency", ("django_redispatterns/idempotency/", "middleware/idempotency.py")),
    ("cache backend (ours)", ("django_redispatterns/cache/",)),
    ("ORM + SQLite (request.user)", ("django/db/",)),
    ("auth (request.user, login)", ("django/contrib/auth/",)),
    ("views (cache get_or_set for theirs)", ("soak/app/views.py",)),
    ("soak timing hook", ("soak/app/middleware.py",)),
    ("Django cache API (theirs: get_or_set)", ("django/core/cache/",)),
    ("Django handler, URLs, responses", ("django/", "asgiref/")),
    ("gunicorn (HTTP, sockets)", ("gunicorn/",)),
]
REDIS_PY = ("redis/",)
OURS_PLUMBING = ("django_redispatterns/connection.py", "django_redispatterns/scripts.py",
                 "django_redispatterns/keys.py", "django_redispatterns/conf.py")
PLUMBING = (*REDIS_PY, *OURS_PLUMBING, "django_redis/")
IN_REQUEST = "django/core/handlers/"


def _is(frame: str, needles: tuple[str, ...]) -> bool:
    return any(frame.startswith(n) or f"/{n}" in frame for n in needles)


def layer_of(frames: list[str]) -> tuple[str, bool, bool]:
    """(layer charged, in redis-py, in our plumbing) for one stack (outermost first)."""
    in_redis = any(_is(f, REDIS_PY) for f in frames)
    in_plumbing = any(_is(f, OURS_PLUMBING) for f in frames)
    for frame in reversed(frames):  # innermost first
        if _is(frame, PLUMBING):
            continue
        for layer, needles in LAYERS:
            if any(n in frame for n in needles):
                return layer, in_redis, in_plumbing
    return "other (json, logging, stdlib)", in_redis, in_plumbing


def _frame_key(frame: str) -> str:
    # py-spy raw frames look like "function (path/to/file.py:123)": match "file.py:function".
    if " (" not in frame:
        return frame
    func, rest = frame.split(" (", 1)
    return f"{rest.rsplit(':', 1)[0]}:{func}"


def attribute(raw: Path) -> tuple[Counter[str], Counter[str], Counter[str], int]:
    shares: Counter[str] = Counter()
    redis_part: Counter[str] = Counter()
    plumbing_part: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [_frame_key(f) for f in stack.split(";") if not f.startswith("process ")]
        if not any(IN_REQUEST in f for f in frames):
            continue
        n = int(count)
        layer, in_redis, in_plumbing = layer_of(frames)
        shares[layer] += n
        redis_part[layer] += n if in_redis else 0
        plumbing_part[layer] += n if in_plumbing else 0
        total += n
    return shares, redis_part, plumbing_part, total


def record(pid: int, seconds: float, out: Path, *, idle: bool) -> bool:
    """py-spy of ``pid`` and its children for ``seconds``; False when py-spy is missing."""
    binary = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(binary).exists():
        return False
    args = [binary, "record", "--pid", str(pid), "--subprocesses", "--rate", "200",
            "--duration", str(int(seconds)), "--format", "raw", "--nonblocking",
            "-o", str(out)]
    if idle:
        args.append("--idle")
    done = subprocess.run(args, capture_output=True, text=True, timeout=seconds + 60)
    return done.returncode == 0 and out.exists()


def table(title: str, raw: Path) -> list[str]:
    shares, redis_part, plumbing, total = attribute(raw)
    lines = [f"\n### {title} ({total:,} samples in requests)",
             f"{'layer':<48} {'share':>7} {'in redis-py':>12} {'in our connection/scripts':>26}"]
    for layer, n in shares.most_common():
        lines.append(f"{layer:<48} {100 * n / total:>6.1f}% "
                     f"{100 * redis_part[layer] / total:>11.1f}% "
                     f"{100 * plumbing[layer] / total:>25.1f}%")
    return lines


def hot_functions(raw: Path, prefix: str = "django_redispatterns/", n: int = 12) -> list[str]:
    """Our functions by inclusive share of in-request samples (on the stack), and by self
    share (the sample's innermost frame is that function: our own Python, no callee)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    leaf_kinds: Counter[str] = Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        frames = [_frame_key(f) for f in stack.split(";") if not f.startswith("process ")]
        if not any(IN_REQUEST in f for f in frames):
            continue
        k = int(count)
        total += k
        for f in {f for f in frames if prefix in f}:
            inclusive[f] += k
        leaf = frames[-1]
        if prefix in leaf:
            own[leaf] += k
        leaf_kinds[_leaf_kind(leaf, prefix)] += k
    lines = ["innermost frame of each sample: " + ", ".join(
        f"{kind} {100 * k / max(total, 1):.1f}%" for kind, k in leaf_kinds.most_common())]
    lines.append(f"{'our function (file:function)':<72} {'on stack':>9} {'self':>6}")
    for func, k in inclusive.most_common(n):
        name = func.split(prefix, 1)[-1]
        lines.append(f"{name:<72} {100 * k / max(total, 1):>8.1f}% "
                     f"{100 * own[func] / max(total, 1):>5.1f}%")
    return lines


def _leaf_kind(leaf: str, prefix: str) -> str:
    if "send_packed_command" in leaf or "_read_from_socket" in leaf:
        return "socket send/recv (redis-py)"
    if _is(leaf, REDIS_PY):
        return "redis-py (packing, parsing, pool)"
    if prefix in leaf:
        return "our own Python"
    if "django/db/" in leaf:
        return "ORM + SQLite"
    if leaf.startswith("django/") or "/django/" in leaf:
        return "Django"
    return "other"
