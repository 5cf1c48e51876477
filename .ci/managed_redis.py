"""A locked-down Redis like a managed one, for running the whole test suite through it.

    python .ci/managed_redis.py run -- COMMAND...   # start it, run COMMAND, check, stop

Starts ``$REDIS_SERVER`` (else ``redis-server``) on a free loopback port with an ACL file
and no default user, then runs COMMAND with:

* ``REDIS_URL``: the ``app`` user, holding exactly the commands and channels that
  ``manage.py redis_acl --all --cache-extras`` prints for the test settings (the suite
  tests django-redis's data-type API too). Its key patterns are the
  printed ones widened to this run's namespace (``rptest-<run>-*``): the suite's tests
  also write under prefixes of their own derived from the worker's (``<prefix>-other``).
* ``RPTEST_HARNESS_URL``: the ``harness`` user, for the tests' own set-up, checks and
  clean-up (any key, any command but the refused ones below).

Refused to both users, as managed services do: ``CONFIG``, ``KEYS``, ``FLUSHALL``,
``FLUSHDB``, ``DEBUG``, ``MONITOR``, ``CLIENT KILL``, ``SHUTDOWN``. Before COMMAND
another program's keys are seeded (``shared_redis.py``); afterwards they must be intact
and the suite must have left no key behind. ``--tls`` is reserved for serving TLS only
with a throwaway CA; this script does not build one yet and refuses the option.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import redis

ROOT = Path(__file__).resolve().parent.parent
REFUSED = ("-config", "-keys", "-flushall", "-flushdb", "-debug", "-monitor", "-client|kill",
           "-shutdown")
APP, HARNESS = "app", "harness"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def printed_rule(run: str) -> list[str]:
    """``manage.py redis_acl --all`` for the test settings of this run, as words."""
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "tests.settings", "RPTEST_RUN": run,
           "REDIS_URL": "redis://127.0.0.1:1/0", "PYTHONPATH": str(ROOT)}
    env.pop("PYTEST_XDIST_WORKER", None)
    out = subprocess.run(
        [sys.executable, "-m", "django", "redis_acl", "--all", "--cache-extras", "--user", APP],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True).stdout
    lines = [line for line in out.splitlines() if line.startswith("ACL SETUSER")]
    if len(lines) != 1:
        sys.exit(f"redis_acl printed {len(lines)} ACL lines, expected one:\n{out}")
    return lines[0].split()


def acl_file(run: str, app_password: str, harness_password: str) -> str:
    words = printed_rule(run)
    assert words[:6] == ["ACL", "SETUSER", APP, "reset", "on", "><password>"], words
    rights = [w for w in words[6:] if not w.startswith("~")]  # commands and channels
    app = ["user", APP, "on", f">{app_password}", f"~rptest-{run}-*", *rights]
    harness = ["user", HARNESS, "on", f">{harness_password}", "~*", "&*", "+@all",
               *REFUSED]
    return "\n".join([" ".join(app), " ".join(harness), "user default off"]) + "\n"


def wait_ready(url: str, timeout: float = 15) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(url).ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                sys.exit("the managed Redis did not start")
            time.sleep(0.1)


def run(command: list[str]) -> int:
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "redis-server"
    run_id = os.environ.get("RPTEST_RUN") or secrets.token_hex(3)
    app_password, harness_password = secrets.token_hex(12), secrets.token_hex(12)
    directory = Path(tempfile.mkdtemp(prefix="rp-managed-"))
    acl = directory / "users.acl"
    acl.write_text(acl_file(run_id, app_password, harness_password))
    print("app user:", acl.read_text().splitlines()[0].replace(app_password, "***"))
    port = free_port()
    server = subprocess.Popen(
        [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(directory), "--aclfile", str(acl)],
        stdout=(directory / "server.log").open("w"), stderr=subprocess.STDOUT)
    app_url = f"redis://{APP}:{app_password}@127.0.0.1:{port}/0"
    harness_url = f"redis://{HARNESS}:{harness_password}@127.0.0.1:{port}/0"
    status = 0
    try:
        wait_ready(harness_url)
        shared = [sys.executable, str(ROOT / ".ci" / "shared_redis.py")]
        manifest = str(directory / "manifest.json")
        subprocess.run([*shared, "seed", harness_url, manifest], check=True)
        env = {**os.environ, "REDIS_URL": app_url, "RPTEST_HARNESS_URL": harness_url,
               "RPTEST_RUN": run_id}
        status = subprocess.run(command, env=env).returncode
        # checked whatever the tests said: a failed test must not hide a key it left
        verify = subprocess.run([*shared, "verify", harness_url, manifest, "--whole-server"])
        status = status or verify.returncode
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)
    return status


def main(argv: list[str]) -> int:
    if "--tls" in argv[: argv.index("--")] if "--" in argv else "--tls" in argv:
        sys.exit("--tls: a TLS-only server with a throwaway CA is not available here yet")
    if len(argv) < 3 or argv[0] != "run" or "--" not in argv:
        sys.exit(__doc__)
    return run(argv[argv.index("--") + 1:])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
