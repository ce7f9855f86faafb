"""A direct channel for the per-iteration calls between a coordinator and a worker.

Ray places the actors, starts and stops them, and carries everything that is not in
the hot loop (start, release, the baseline, info). The loop's calls — one or two per
iteration, a few kilobytes each — go over a plain TCP connection from the coordinator
to the worker's process instead: a Ray actor call costs 1–3 ms of scheduling, gRPC and
thread hand-offs on a small machine, which at batch 1 is a third of an iteration; a
socket round trip on the same node costs tens of microseconds and blocks in ``recv``
(no busy polling, unlike Ray Compiled Graphs' shared-memory channels).

Protocol, one request at a time per connection: the client sends a frame holding the
method name and :mod:`workers.wire` blobs (the arguments, then any other calls'
results to append, as ``ModelWorker.call`` takes them); the server answers with a frame
holding ``(True, result_blob)`` or ``(False, error_text)``. A frame is an 8-byte
big-endian length and the payload. Only this package's coordinator connects (the
worker listens on its node's address for the length of a job), hence pickle.

A worker that dies mid-call closes the socket: the client raises
:class:`ChannelClosed`, which jobs treat like Ray's ``RayActorError`` (the batch is
retried).
"""

from __future__ import annotations

import pickle
import socket
import struct
import threading
from collections.abc import Callable

_HEADER = struct.Struct(">Q")
MAX_FRAME = 1 << 31  # 2 GiB: anything larger is a corrupted header


class ChannelClosed(ConnectionError):
    """The worker at the other end went away (or never answered)."""


class ChannelCallError(RuntimeError):
    """The worker raised while serving a call; the message holds its traceback."""


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    buffer = bytearray(size)
    view = memoryview(buffer)
    received = 0
    while received < size:
        n = sock.recv_into(view[received:], size - received)
        if n == 0:
            raise ChannelClosed("the worker closed the channel")
        received += n
    return bytes(buffer)


def send_frame(sock: socket.socket, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(len(payload)) + payload)


def recv_frame(sock: socket.socket) -> bytes:
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > MAX_FRAME:
        raise ChannelClosed(f"corrupted frame header (length {size})")
    return _recv_exactly(sock, size)


def _node_address() -> str:
    """This node's address as Ray sees it (127.0.0.1 without Ray or for a local one)."""
    try:
        import ray

        if ray.is_initialized():
            return ray.util.get_node_ip_address()
    except Exception:
        pass
    return "127.0.0.1"


class ChannelServer:
    """Serves ``handler(method, *blobs) -> bytes`` on a TCP port, one thread per client.

    Calls are serialised by a lock: the worker hosts one model, and its compute is not
    faster for being entered twice.
    """

    def __init__(self, handler: Callable[..., bytes], host: str | None = None):
        self._handler = handler
        self._lock = threading.Lock()
        self._listener = socket.create_server((host or _node_address(), 0))
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._closed = False
        threading.Thread(target=self._accept, name="specdec-channel", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        import traceback

        with conn:
            while True:
                try:
                    method, blobs = pickle.loads(recv_frame(conn))
                except (ChannelClosed, OSError):
                    return
                try:
                    with self._lock:
                        reply = (True, self._handler(method, *blobs))
                except Exception as error:
                    text = "".join(traceback.format_exception(error))
                    reply = (False, f"{type(error).__name__}: {error}\n{text}")
                try:
                    send_frame(conn, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
                except OSError:
                    return

    def close(self) -> None:
        self._closed = True
        self._listener.close()


class ChannelClient:
    """The coordinator's end: ``call(method, *blobs) -> result blob``."""

    def __init__(self, address: tuple[str, int], *, name: str = "worker", timeout: float = 10.0):
        self.name = name
        try:
            self._sock = socket.create_connection(tuple(address), timeout=timeout)
        except OSError as error:
            raise ChannelClosed(f"cannot connect to the {name} at {address}: {error}") from error
        self._sock.settimeout(None)  # a call lasts as long as the model takes
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def call(self, method: str, *blobs: bytes) -> bytes:
        try:
            send_frame(self._sock, pickle.dumps((method, blobs), pickle.HIGHEST_PROTOCOL))
            ok, value = pickle.loads(recv_frame(self._sock))
        except (ChannelClosed, OSError) as error:
            raise ChannelClosed(f"the {self.name} went away during {method!r}: {error}") from error
        if not ok:
            raise ChannelCallError(f"the {self.name} failed in {method!r}: {value}")
        return value

    def close(self) -> None:
        try:
            self._sock.close()
        except OSError:
            pass
