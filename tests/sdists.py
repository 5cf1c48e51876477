"""Source distributions of installed packages, fetched from PyPI at test time.

The suites that run another project's own tests against our code (django-redis's, Django's
cache tests) read them from the sdist of the *installed* version; nothing is copied into
this repository. Archives are cached in ``$RP_SDIST_DIR`` (default ``.cache/sdists`` in the
checkout, git-ignored), so a re-run or a CI stage with a kept workspace downloads nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.redis_servers import RedisServer

SDIST_DIR = Path(os.environ.get("RP_SDIST_DIR")
                 or Path(__file__).resolve().parent.parent / ".cache" / "sdists")


def sdist(project: str, version: str) -> Path:
    """The ``project==version`` sdist archive; skips the test when it cannot be had
    (offline, no PyPI access)."""
    name = f"{project.replace('-', '_').lower()}-{version}.tar.gz"
    archive = SDIST_DIR / name
    if archive.exists():
        return archive
    SDIST_DIR.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary",
         ":all:", f"{project}=={version}", "-d", str(SDIST_DIR)],
        capture_output=True, text=True, timeout=300,
    )
    if result.returncode != 0 or not archive.exists():
        pytest.skip(f"cannot download the {project} {version} sdist (offline?): "
                    f"{result.stderr[-500:]}")
    return archive


def private_server() -> Iterator[RedisServer]:
    """A redis-server of the calling module's own (for a module fixture): another project's
    tests use other databases, keys outside our prefixes and whole-server ``clear()``, so
    never a shared ``REDIS_URL``."""
    try:
        server = RedisServer()
    except RuntimeError as exc:
        pytest.skip(str(exc))
    yield server
    server.stop()
