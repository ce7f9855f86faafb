"""A direct channel for the per-iteration calls between a coordinator and a worker.

Ray places the actors, starts and stops them, and carries everything that is not in
the hot loop (start, release, the baseline, info). The loop's calls — one or two per
iteration, a few kilobytes each — go over a plain TCP connection from the coordinator
to the worker's process instead: a Ray actor call costs milliseconds of scheduling, gRPC
and thread hand-offs, a large share of an iteration at batch 1; a socket round trip on
the same node costs tens of microseconds and blocks in ``recv``
(no busy polling, unlike Ray Compiled Graphs' shared-memory channels).

Security. Anything that can reach the port can connect, so:

- Every connection is authenticated with the job's secret (32 random bytes that the
  driver makes per engine and hands to the coordinator and, through Ray, to each
  worker's :meth:`~workers.model_worker.ModelWorker.open_channel`). Both sides prove
  that they hold it, as :mod:`multiprocessing.connection` does: the server sends a
  random nonce, the client answers with HMAC-SHA256(secret, its label + both nonces)
  and its own nonce, the server checks it (:func:`hmac.compare_digest`) and answers
  the client's nonce the same way. The secret itself never crosses.
- Nothing received is unpickled: frames carry :mod:`workers.wire` blobs, whose
  decoder builds only plain values, numpy arrays of plain dtypes and registered
  dataclasses.
- A connection that fails authentication or sends a malformed, truncated or oversized
  frame is closed, with one warning on the ``specdec.channel`` logger; the server's
  other connections and the worker go on.
- Bind address (:func:`bind_host`): ``SPECDEC_CHANNEL_HOST`` when set; else the
  loopback address when Ray is not running or when every node of the Ray cluster is
  on this machine; else (a cluster that spans machines) this node's address.

Protocol, after the handshake, one request at a time per connection. A frame is a
16-byte header — magic ``SDCF``, version, kind (request, result or error), method id
(the index of the method in the table both ends were given), and the payload length
(at most ``max_frame``, checked before anything is allocated) — then the payload. A
request's payload is a wire-encoded tuple of blobs (the arguments, then any other
calls' results to append, as ``ModelWorker.call`` takes them); a result's is the
result blob; an error's is the worker's traceback as UTF-8 text.

A worker that dies mid-call closes the socket: the client raises
:class:`ChannelClosed`, which jobs treat like Ray's ``RayActorError`` (the batch is
retried).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import secrets
import socket
import struct
import threading
import traceback
from collections.abc import Callable, Sequence

from workers import wire

LOG = logging.getLogger("specdec.channel")

# The per-iteration calls of ModelWorker (workers.model_worker.WIRE_METHODS): the
# method id in a frame is the index in this table.
METHODS = ("propose_first", "score", "recover_and_propose", "propose_ahead", "settle")
MAX_FRAME = 256 << 20  # bytes of payload; a larger header is a corrupted or hostile frame
HANDSHAKE_TIMEOUT_S = 10.0
HOST_ENV = "SPECDEC_CHANNEL_HOST"

_MAGIC = b"SDCF"
_VERSION = 1
_HEADER = struct.Struct(">4sBBBxQ")  # magic, version, kind, method id, payload length
_REQUEST, _RESULT, _ERROR = 1, 2, 3
_NONCE = 32
_DIGEST = hashlib.sha256().digest_size
_HELLO = _MAGIC + b"AUTH" + bytes([_VERSION])  # then the server's nonce
_CLIENT_LABEL = b"specdec-channel client"
_SERVER_LABEL = b"specdec-channel server"


class ChannelClosed(ConnectionError):
    """The worker at the other end went away (or never answered)."""


class ChannelCallError(RuntimeError):
    """The worker raised while serving a call; the message holds its traceback."""


class ChannelProtocolError(ChannelClosed):
    """The peer broke the protocol: failed authentication or sent a malformed frame."""


def new_secret() -> bytes:
    """A job's channel secret."""
    return secrets.token_bytes(32)


def _check_secret(secret: bytes) -> bytes:
    if not isinstance(secret, bytes) or len(secret) < 16:
        raise ValueError("the channel secret must be at least 16 bytes (see new_secret())")
    return secret


def _digest(secret: bytes, label: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, label + b"".join(nonces), hashlib.sha256).digest()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        n = sock.recv_into(view[received:], size - received)
        if n == 0:
            if received:
                raise ChannelProtocolError(f"truncated: {received} of {size} bytes, then EOF")
            raise ChannelClosed("the peer closed the channel")
        received += n
    return bytes(buffer)


def send_frame(sock: socket.socket, kind: int, method_id: int, payload: bytes) -> None:
    header = _HEADER.pack(_MAGIC, _VERSION, kind, method_id, len(payload))
    if len(payload) < 65536:
        sock.sendall(header + payload)
    else:  # no copy of a large payload
        sock.sendall(header)
        sock.sendall(payload)


def recv_frame(sock: socket.socket, max_frame: int = MAX_FRAME) -> tuple[int, int, bytes]:
    """(kind, method id, payload); :class:`ChannelProtocolError` for a bad header."""
    magic, version, kind, method_id, size = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if magic != _MAGIC or version != _VERSION:
        raise ChannelProtocolError(f"not a channel frame (magic {magic!r}, version {version})")
    if kind not in (_REQUEST, _RESULT, _ERROR):
        raise ChannelProtocolError(f"unknown frame kind {kind}")
    if size > max_frame:
        raise ChannelProtocolError(f"frame of {size} bytes exceeds the limit of {max_frame}")
    try:
        return kind, method_id, _recv_exactly(sock, size)
    except ChannelClosed as error:
        if size:
            raise ChannelProtocolError(f"truncated frame of {size} bytes: {error}") from None
        raise


def _cluster_is_local(ray) -> bool:
    """Whether every alive node of the Ray cluster has this node's address."""
    here = ray.util.get_node_ip_address()
    addresses = {n["NodeManagerAddress"] for n in ray.nodes() if n.get("Alive")}
    return addresses <= {here}


def bind_host() -> str:
    """The address a worker's channel listens on (the rule in the module docstring)."""
    configured = os.environ.get(HOST_ENV)
    if configured:
        return configured
    try:
        import ray

        if ray.is_initialized() and not _cluster_is_local(ray):
            return ray.util.get_node_ip_address()
    except Exception as error:  # no Ray, or its state cannot be read: stay private
        LOG.debug("cannot read the Ray cluster's nodes (%s); binding to loopback", error)
    return "127.0.0.1"


class ChannelServer:
    """Serves ``handler(method, *blobs) -> bytes`` on a TCP port, one thread per client.

    Only clients that prove they hold ``secret`` are served. Calls are serialised by
    a lock: the worker hosts one model, and its compute is not faster for being
    entered twice.
    """

    def __init__(
        self,
        handler: Callable[..., bytes],
        *,
        secret: bytes,
        host: str | None = None,
        methods: Sequence[str] = METHODS,
        max_frame: int = MAX_FRAME,
    ):
        self.secret = _check_secret(secret)
        self._handler = handler
        self._methods = tuple(methods)
        self._max_frame = max_frame
        self._lock = threading.Lock()
        self._listener = socket.create_server((host or bind_host(), 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._closed = False
        threading.Thread(target=self._accept, name="specdec-channel", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, peer = self._listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn, peer), daemon=True).start()

    def _authenticate(self, conn: socket.socket) -> None:
        """The client proves it holds the secret, then the server does."""
        conn.settimeout(HANDSHAKE_TIMEOUT_S)
        server_nonce = secrets.token_bytes(_NONCE)
        conn.sendall(_HELLO + server_nonce)
        answer = _recv_exactly(conn, _DIGEST + _NONCE)
        client_digest, client_nonce = answer[:_DIGEST], answer[_DIGEST:]
        expected = _digest(self.secret, _CLIENT_LABEL, server_nonce, client_nonce)
        if not hmac.compare_digest(client_digest, expected):
            raise ChannelProtocolError("authentication failed (wrong or missing secret)")
        conn.sendall(_digest(self.secret, _SERVER_LABEL, client_nonce, server_nonce))
        conn.settimeout(None)  # an authenticated coordinator may idle between batches

    def _serve(self, conn: socket.socket, peer) -> None:
        authenticated = False
        with conn:
            try:
                self._authenticate(conn)
                authenticated = True
                while self._serve_one(conn):
                    pass
            except ChannelProtocolError as error:
                LOG.warning("channel: closed the connection from %s: %s", peer, error)
            except TimeoutError:
                LOG.warning("channel: closed the connection from %s: handshake timed out", peer)
            except (ChannelClosed, OSError) as error:
                if not authenticated:  # an authenticated client that leaves is no news
                    LOG.warning("channel: %s left before authenticating (%s)", peer, error)

    def _serve_one(self, conn: socket.socket) -> bool:
        """Reads one request and answers it; False when the client has gone."""
        try:
            kind, method_id, payload = recv_frame(conn, self._max_frame)
        except ChannelProtocolError:
            raise
        except ChannelClosed:
            return False
        if kind != _REQUEST or method_id >= len(self._methods):
            raise ChannelProtocolError(f"not a request (kind {kind}, method id {method_id})")
        try:
            blobs = wire.loads(payload)
        except wire.WireDecodeError as error:
            raise ChannelProtocolError(f"malformed request payload: {error}") from None
        if type(blobs) is not tuple or not all(type(b) is bytes for b in blobs):
            raise ChannelProtocolError("a request's payload is not a tuple of blobs")
        method = self._methods[method_id]
        try:
            with self._lock:
                kind, reply = _RESULT, self._handler(method, *blobs)
        except wire.WireDecodeError as error:  # a blob inside the request
            raise ChannelProtocolError(f"malformed argument of {method!r}: {error}") from None
        except Exception as error:
            text = "".join(traceback.format_exception(error))
            kind, reply = _ERROR, f"{type(error).__name__}: {error}\n{text}".encode()
        send_frame(conn, kind, method_id, reply)
        return True

    def close(self) -> None:
        self._closed = True
        self._listener.close()


class ChannelClient:
    """The coordinator's end: ``call(method, *blobs) -> result blob``."""

    def __init__(
        self,
        address: tuple[str, int],
        *,
        secret: bytes,
        name: str = "worker",
        timeout: float = 10.0,
        methods: Sequence[str] = METHODS,
        max_frame: int = MAX_FRAME,
    ):
        self.name = name
        self._method_ids = {method: i for i, method in enumerate(methods)}
        self._max_frame = max_frame
        _check_secret(secret)
        try:
            self._sock = socket.create_connection(tuple(address), timeout=timeout)
            self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._authenticate(secret)
        except OSError as error:
            self.close()
            raise ChannelClosed(f"cannot connect to the {name} at {address}: {error}") from error
        self._sock.settimeout(None)  # a call lasts as long as the model takes

    def _authenticate(self, secret: bytes) -> None:
        hello = _recv_exactly(self._sock, len(_HELLO) + _NONCE)
        if hello[: len(_HELLO)] != _HELLO:
            raise ChannelProtocolError("the peer is not a specdec channel")
        server_nonce, client_nonce = hello[len(_HELLO) :], secrets.token_bytes(_NONCE)
        digest = _digest(secret, _CLIENT_LABEL, server_nonce, client_nonce)
        self._sock.sendall(digest + client_nonce)
        try:
            proof = _recv_exactly(self._sock, _DIGEST)
        except ChannelClosed as error:
            raise ChannelProtocolError(
                f"the worker refused the secret (closed the connection): {error}"
            ) from None
        expected = _digest(secret, _SERVER_LABEL, client_nonce, server_nonce)
        if not hmac.compare_digest(proof, expected):
            raise ChannelProtocolError("the worker does not hold the job's secret")

    def call(self, method: str, *blobs: bytes) -> bytes:
        method_id = self._method_ids.get(method)
        if method_id is None:
            raise ValueError(f"{method!r} is not a channel method ({tuple(self._method_ids)})")
        try:
            send_frame(self._sock, _REQUEST, method_id, wire.dumps(blobs))
            kind, reply_id, value = recv_frame(self._sock, self._max_frame)
            if kind == _REQUEST or reply_id != method_id:
                raise ChannelProtocolError(f"a reply of kind {kind} for method id {reply_id}")
        except (ChannelClosed, OSError) as error:
            raise ChannelClosed(f"the {self.name} went away during {method!r}: {error}") from error
        if kind == _ERROR:
            text = value.decode(errors="replace")
            raise ChannelCallError(f"the {self.name} failed in {method!r}: {text}")
        return value

    def close(self) -> None:
        try:
            self._sock.close()
        except (OSError, AttributeError):
            pass
