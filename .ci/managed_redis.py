"""A locked-down Redis like a managed one, for running the whole test suite through it.

    python .ci/managed_redis.py run [--tls] -- COMMAND...   # start it, run COMMAND, check, stop

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
and the suite must have left no key behind.

With ``--tls`` the server speaks TLS only (``--port 0``), with certificates from a
throwaway CA made for the run, and requires a client certificate. Both URLs are then
``rediss://`` and COMMAND also gets ``REDIS_TLS_CA_CERTS`` (the private CA),
``REDIS_TLS_CERTFILE``, and ``REDIS_TLS_KEYFILE`` with ``REDIS_TLS_KEY_PASSWORD``: the
client key is encrypted, so the key-password setting is exercised by every connection.
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
sys.path.insert(0, str(ROOT))
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


def tls_setup(directory: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """A throwaway CA in ``directory``: the server's TLS options and the clients' env."""
    from tests.tls_servers import KEY_PASSPHRASE, make_certificates, tls_args, tls_skip_reason

    reason = tls_skip_reason()
    if reason:
        sys.exit(f"--tls: {reason}")
    certs = make_certificates(directory / "tls")
    env = {"REDIS_TLS_CA_CERTS": certs.ca, "REDIS_TLS_CERTFILE": certs.path("client.crt"),
           "REDIS_TLS_KEYFILE": certs.path("client-encrypted.key"),
           "REDIS_TLS_KEY_PASSWORD": KEY_PASSPHRASE}
    return tls_args(certs, port, auth_clients="yes"), env


def wait_ready(url: str, tls_env: dict[str, str], timeout: float = 15) -> None:
    from tests.redis_servers import TLS_ENV

    kwargs = {kw: tls_env[name] for kw, name in TLS_ENV.items() if name in tls_env}
    deadline = time.monotonic() + timeout
    while True:
        try:
            redis.Redis.from_url(url, **kwargs).ping()
            return
        except redis.RedisError:
            if time.monotonic() > deadline:
                sys.exit("the managed Redis did not start")
            time.sleep(0.1)


def run(command: list[str], tls: bool = False) -> int:
    binary = os.environ.get("REDIS_SERVER") or shutil.which("redis-server") or "redis-server"
    run_id = os.environ.get("RPTEST_RUN") or secrets.token_hex(3)
    app_password, harness_password = secrets.token_hex(12), secrets.token_hex(12)
    directory = Path(tempfile.mkdtemp(prefix="rp-managed-"))
    acl = directory / "users.acl"
    acl.write_text(acl_file(run_id, app_password, harness_password))
    print("app user:", acl.read_text().splitlines()[0].replace(app_password, "***"))
    port = free_port()
    listen, tls_env, scheme = ["--port", str(port)], {}, "redis"
    if tls:
        tls_options, tls_env = tls_setup(directory, port)
        listen, scheme = ["--port", "0", *tls_options], "rediss"
        print("TLS only on port", port, "with a throwaway CA, client certificates required")
    server = subprocess.Popen(
        [binary, *listen, "--bind", "127.0.0.1", "--save", "", "--appendonly",
         "no", "--dir", str(directory), "--aclfile", str(acl)],
        stdout=(directory / "server.log").open("w"), stderr=subprocess.STDOUT)
    app_url = f"{scheme}://{APP}:{app_password}@127.0.0.1:{port}/0"
    harness_url = f"{scheme}://{HARNESS}:{harness_password}@127.0.0.1:{port}/0"
    status = 0
    try:
        wait_ready(harness_url, tls_env)
        env = {**os.environ, **tls_env, "REDIS_URL": app_url,
               "RPTEST_HARNESS_URL": harness_url, "RPTEST_RUN": run_id}
        shared = [sys.executable, str(ROOT / ".ci" / "shared_redis.py")]
        manifest = str(directory / "manifest.json")
        subprocess.run([*shared, "seed", harness_url, manifest], check=True, env=env)
        status = subprocess.run(command, env=env).returncode
        # checked whatever the tests said: a failed test must not hide a key it left
        verify = subprocess.run([*shared, "verify", harness_url, manifest, "--whole-server"],
                                env=env)
        status = status or verify.returncode
    finally:
        server.terminate()
        server.wait(timeout=30)
        shutil.rmtree(directory, ignore_errors=True)
    return status


def main(argv: list[str]) -> int:
    if "--" not in argv or argv[0] != "run":
        sys.exit(__doc__)
    options, command = argv[1:argv.index("--")], argv[argv.index("--") + 1:]
    if not command or set(options) - {"--tls"}:
        sys.exit(__doc__)
    return run(command, tls="--tls" in options)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
