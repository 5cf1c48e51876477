"""A mixed fleet on one Redis: worker processes running *other* library versions.

Each :class:`Peer` is a virtualenv of its own (under ``.cache/venvs/`` in the checkout, or
``$RP_VENV_DIR``) with one set of pins installed — django-redis 5.4, 6 or 7, or the previous
release of this package built from its git tag — and runs ``tests/fleet_worker.py`` there
with the same cache settings as the test process. The venv is built once per pin set (its
name is a hash of the pins) and reused by later runs; a test whose venv cannot be built
(no access to PyPI) skips and says why.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
VENV_DIR = Path(os.environ.get("RP_VENV_DIR") or ROOT / ".cache" / "venvs")
WORKER = Path(__file__).resolve().parent / "fleet_worker.py"
EXTRAS = ("msgpack>=1", "lz4>=4")
# The previous release, 0.1.0 (tag v0.1.0), by commit: a clone without tags still has it.
PREVIOUS_RELEASE = "984a4a9b55ebab6f899070712bfdd3f0e1e8fe13"

# The stacks teams run today, each with the serializers and compressors they may configure.
DJANGO_REDIS = {
    "5.4": ("Django>=4.2,<5.3", "django-redis==5.4.0", "redis>=5,<6", *EXTRAS),
    "6": ("Django>=5.2,<6", "django-redis==6.0.0", "redis>=5", *EXTRAS),
    "7": ("django-redis==7.0.0", *EXTRAS),
}


class Peer:
    """A worker process of another version; :meth:`run` sends it Python snippets."""

    def __init__(self, name: str, pins: tuple[str, ...], source: Path | None = None) -> None:
        self.name = name
        self.pins = pins
        self.source = source
        digest = hashlib.sha256("\n".join((*pins, str(source))).encode()).hexdigest()[:12]
        self.venv = VENV_DIR / f"{name.replace(' ', '-')}-{digest}"

    @property
    def python(self) -> Path:
        return Path(sys.executable) if self.name == "current" else self.venv / "bin" / "python"

    def ensure(self) -> None:
        """Build the venv once (a file lock keeps parallel test workers from racing)."""
        stamp = self.venv / ".built"
        if self.name == "current":
            return
        if stamp.exists():
            return
        VENV_DIR.mkdir(parents=True, exist_ok=True)
        with open(VENV_DIR / f".{self.venv.name}.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if stamp.exists():
                return
            subprocess.run([sys.executable, "-m", "venv", "--clear", str(self.venv)],
                           check=True, capture_output=True, timeout=300)
            wanted = [*self.pins, *([str(self.source)] if self.source else [])]
            result = subprocess.run(
                [str(self.python), "-m", "pip", "install", "--quiet", *wanted],
                capture_output=True, text=True, timeout=900)
            if result.returncode != 0:
                pytest.skip(f"cannot build the {self.name} venv (no PyPI?): "
                            f"{result.stderr[-400:]}")
            stamp.write_text("\n".join(wanted))

    def run(self, settings: dict[str, Any], code: str, **names: Any) -> Any:
        """Run ``code`` in the worker with Django configured by ``settings``; ``names``
        (JSON values) are its globals, ``cache`` is ``caches["default"]``; returns the
        JSON value the code assigns to ``result``. An exception in the worker is returned
        as ``{"error": "Type: message"}``."""
        self.ensure()
        request = json.dumps({"settings": settings, "code": code, "names": names})
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "DJANGO_SETTINGS_MODULE")}
        done = subprocess.run([str(self.python), str(WORKER)], input=request, env=env,
                              capture_output=True, text=True, timeout=120,
                              cwd=tempfile.gettempdir())
        if done.returncode != 0:
            raise AssertionError(f"{self.name} worker died: {done.stderr[-2000:]}")
        return json.loads(done.stdout.strip().splitlines()[-1])

    def versions(self) -> dict[str, str]:
        return self.run({}, "from importlib.metadata import version as v\n"
                            "result = {p: v(p) for p in wanted}",
                        wanted=["Django", "redis", "django-redis"])


def current() -> Peer:
    """This checkout, in a process of its own (the test's own interpreter)."""
    return Peer("current", ())


def django_redis_peer(version: str) -> Peer:
    return Peer(f"django-redis {version}", DJANGO_REDIS[version])


def previous_release() -> Peer:
    """This package as released at the previous tag, from this repository's own history."""
    digest = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", f"{PREVIOUS_RELEASE}^{{commit}}"],
        capture_output=True, text=True)
    if digest.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE[:12]} (release 0.1.0) is not in this checkout "
                    "(shallow clone?)")
    source = VENV_DIR / f"src-0.1.0-{digest.stdout.strip()[:12]}"
    if not (source / "pyproject.toml").exists():
        VENV_DIR.mkdir(parents=True, exist_ok=True)
        archive = VENV_DIR / f"{source.name}.tar"
        subprocess.run(["git", "-C", str(ROOT), "archive", "--format=tar", "-o", str(archive),
                        PREVIOUS_RELEASE], check=True, timeout=120)
        with tarfile.open(archive) as tar:
            tar.extractall(source)  # our own repository's archive
        archive.unlink()
    return Peer("redispatterns 0.1.0", EXTRAS, source=source)
