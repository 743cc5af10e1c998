"""What a client and a build service (build/service.py) agree on, without TVM: where the service
listens, how both sides get the job's key, how a connection is opened and authenticated, and the
shape of a batch and of its results. Local mode imports this to start the service; builder.py to
place its artifacts; the client's RemoteBuilder to reach the service.

A service address is a Unix socket path (local mode: the clients and the service share a host) or
``host:port`` over TCP (a cluster: the job's builder pods, on CPU nodes). Both use the same code:
``multiprocessing.connection`` with its HMAC challenge on the key, in both directions (the client
proves it holds the key, and so does the service: a stranger can neither have candidates built
nor hand back artifacts). Nothing is unpickled before that handshake. The traffic itself is not
encrypted (candidates and built code, no secrets): a NetworkPolicy keeps it inside the job.
"""

from __future__ import annotations

import os
import socket
import struct
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from pathlib import Path
from typing import Any

from sharetune.api.topology import BUILD_AUTHKEY_ENV, BUILD_AUTHKEY_FILE_ENV, BUILD_DIR_ENV

AUTHKEY_ENV = BUILD_AUTHKEY_ENV  # the key itself (local mode: set by the run)
AUTHKEY_FILE_ENV = BUILD_AUTHKEY_FILE_ENV  # or a file that holds it (pods: the job's Secret, mounted)
ARTIFACT_DIR_ENV = BUILD_DIR_ENV  # where built candidates go (builder.export_shared); unset: /tmp

# One candidate as it travels: (IRModule, Target, serialized params or None).
Item = tuple[Any, Any, Any]
# One result as a client's builder gives it to MetaSchedule: (artifact path, None) or (None, error).
Result = tuple[str | None, str | None]
# One result on the wire: ((artifact file name, its bytes), None) or (None, error message). The
# bytes, not a path: a builder pod and its client share no filesystem.
WireResult = tuple[tuple[str, bytes] | None, str | None]

HANDSHAKE_TIMEOUT_S = 10.0  # a peer that connects and then says nothing is dropped after this


class AddressError(ValueError):
    pass


def parse_address(addr: str) -> tuple[str | tuple[str, int], str]:
    """``/path/to.sock`` (or ``unix:/path``) -> (path, "AF_UNIX"); ``host:port`` -> ((host, port), "AF_INET")."""
    if addr.startswith("unix:"):
        return addr[len("unix:"):], "AF_UNIX"
    if "/" in addr:
        return addr, "AF_UNIX"
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise AddressError(f"a build service address is a Unix socket path or host:port, got {addr!r}")
    return (host.strip("[]"), int(port)), "AF_INET"


def authkey() -> bytes:
    key = os.environ.get(AUTHKEY_ENV)
    if not key and os.environ.get(AUTHKEY_FILE_ENV):
        key = Path(os.environ[AUTHKEY_FILE_ENV]).read_text().strip()
    if not key:
        raise RuntimeError(f"neither {AUTHKEY_ENV} nor {AUTHKEY_FILE_ENV} is set: the build service and its "
                           "clients share the job's key")
    return key.encode()


def _io_timeout(fd: int, seconds: float) -> None:
    """A receive/send timeout on a blocking socket (0 = none): bounds the handshake, whose reads
    ``multiprocessing.connection`` does with plain blocking ``os.read``."""
    s = socket.socket(fileno=fd)
    try:
        tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    finally:
        s.detach()  # the Connection owns the descriptor


def keepalive(s: socket.socket) -> None:
    """A builder whose node vanished sends no FIN: TCP keepalive notices in ~25 s instead of the
    batch's whole timeout."""
    s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for opt, v in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, opt):
            s.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), v)


def connect(address: str | tuple[str, int], family: str, key: bytes, timeout_s: float) -> Connection:
    """An authenticated connection to a service, or an exception (OSError, AuthenticationError,
    EOFError) within about ``timeout_s`` + the handshake's bound."""
    s = socket.socket(socket.AF_UNIX if family == "AF_UNIX" else socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.settimeout(timeout_s)
        s.connect(address)
        s.setblocking(True)
        if family == "AF_INET":
            keepalive(s)
    except BaseException:
        s.close()
        raise
    conn = Connection(s.detach())
    try:
        _io_timeout(conn.fileno(), HANDSHAKE_TIMEOUT_S)
        answer_challenge(conn, key)
        deliver_challenge(conn, key)
        _io_timeout(conn.fileno(), 0)
    except BaseException:
        conn.close()
        raise
    return conn


def accept_handshake(conn: Connection, key: bytes) -> None:
    """The service's side of :func:`connect`'s handshake, bounded; raises on a wrong key."""
    _io_timeout(conn.fileno(), HANDSHAKE_TIMEOUT_S)
    deliver_challenge(conn, key)
    answer_challenge(conn, key)
    _io_timeout(conn.fileno(), 0)
