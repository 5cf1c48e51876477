"""The end-to-end benchmark's lean load (benchmarks/e2e_load.py) reads answers whole and
spreads its devices evenly over a server's worker processes.

The server here is a real pre-forked HTTP server (four processes accepting on one listening
socket, as gunicorn's workers do), each answering with its pid in ``X-Soak-Worker``; its
workers return to ``accept()`` at different speeds, so connections left to luck pile up on
one of them.
"""

from __future__ import annotations

import collections
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from benchmarks.e2e_load import answer_length, balanced, whose

SERVER = textwrap.dedent("""
    import os, socket, sys, threading, time
    signins = sys.argv[1]  # a file: one line per sign-in
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)

    def serve(conn):
        buffer = b""
        while True:
            chunk = conn.recv(65536)
            if not chunk:
                return
            buffer += chunk
            end = buffer.find(b"\\r\\n\\r\\n")
            if end < 0:
                continue
            length = 0
            for line in buffer[:end].split(b"\\r\\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buffer) < end + 4 + length:
                continue
            cookie = b""
            if buffer.startswith(b"POST /signin "):
                with open(signins, "a") as f:
                    f.write("signin\\n")
                cookie = b"Set-Cookie: sessionid=s%d; Path=/\\r\\n" % os.getpid()
            buffer = buffer[end + 4 + length:]
            body = b'{"user": 1}'
            conn.sendall(b"HTTP/1.1 200 OK\\r\\nContent-Type: application/json\\r\\n" + cookie
                         + b"X-Soak-Worker: %d\\r\\n" % os.getpid()
                         + b"Content-Length: %d\\r\\n\\r\\n" % len(body) + body)

    for index in range(4):
        if os.fork() == 0:
            while True:
                conn, _ = listener.accept()
                threading.Thread(target=serve, args=(conn,), daemon=True).start()
                # Worker 0 is back at accept() at once, the others later and later: left to
                # luck, worker 0 takes most connections.
                time.sleep(0.05 * index)
    sys.stdin.read()  # until the test closes our stdin
    os.killpg(0, 9)
""")


@dataclass
class Preforked:
    port: int
    signins: Path

    def signed_in(self) -> int:
        return len(self.signins.read_text().splitlines()) if self.signins.exists() else 0


@pytest.fixture
def preforked(tmp_path: Path) -> Iterator[Preforked]:
    signins = tmp_path / "signins"
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(signins)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        assert server.stdout is not None
        yield Preforked(int(server.stdout.readline()), signins)
    finally:
        assert server.stdin is not None
        server.stdin.close()
        server.wait(10)


def test_devices_are_spread_evenly_over_the_worker_processes(preforked: Preforked) -> None:
    connections = balanced(preforked.port, 16, 4)
    try:
        workers = collections.Counter(whose(sock, cookie) for sock, cookie in connections)
        assert sorted(workers.values()) == [4, 4, 4, 4], workers
    finally:
        for sock, _cookie in connections:
            sock.close()


def test_each_device_signs_in_once_however_many_connections_it_tries(
        preforked: Preforked) -> None:
    # A user's sessions are capped (SESSIONS["MAX_PER_USER"]): a sign-in per attempt would
    # end the sessions of devices already placed.
    connections = balanced(preforked.port, 16, 4)
    try:
        assert preforked.signed_in() == 16
        assert all(cookie for _sock, cookie in connections)
    finally:
        for sock, _cookie in connections:
            sock.close()


def test_every_connection_is_kept_open(preforked: Preforked) -> None:
    connections = balanced(preforked.port, 8, 4)
    try:
        for sock, _cookie in connections:
            sock.sendall(b"GET /me HTTP/1.1\r\nHost: x\r\n\r\n")
            buffer = b""
            while answer_length(buffer) is None:
                chunk = sock.recv(65536)
                assert chunk, "the kept connection was closed"
                buffer += chunk
            assert answer_length(buffer) == (200, len(buffer))
    finally:
        for sock, _cookie in connections:
            sock.close()


@pytest.mark.parametrize(("answer", "complete"), [
    (b"HTTP/1.1 201 Created\r\nContent-Length: 5\r\n\r\nhello", True),
    (b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhel", False),  # body still coming
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n", False),  # head still coming
    (b"HTTP/1.1 204 No Content\r\nServer: x\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", True),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n", False),
])
def test_an_answer_is_complete_only_when_its_body_is(answer: bytes, complete: bool) -> None:
    expected = (int(answer[9:12]), len(answer)) if complete else None
    assert answer_length(answer) == expected
    if complete:  # what follows the answer (a pipelined one) is not counted in it
        assert answer_length(answer + b"HTTP/1.1 200 OK\r\n") == expected


def test_a_socket_closed_before_its_answer_is_an_error() -> None:
    listener = socket.create_server(("127.0.0.1", 0))
    with listener, socket.create_connection(listener.getsockname()) as client:
        conn, _ = listener.accept()
        conn.close()
        from benchmarks.e2e_load import exchange

        with pytest.raises(OSError):
            exchange(client, b"GET / HTTP/1.1\r\n\r\n")
