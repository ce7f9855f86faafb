"""The direct channel between a coordinator and a worker (workers.channel) and the
format of what crosses it (workers.wire): authenticated, pickle-free, and robust to
hostile clients."""

import dataclasses
import logging
import os
import pathlib
import pickle
import socket
import struct
import threading

import jax
import ml_dtypes
import numpy as np
import pytest

from specdec_core import decoding
from specdec_core.sampling import GREEDY, SamplingConfig
from workers import channel, wire
from workers.batching import DecodeSettings
from workers.channel import (
    ChannelCallError,
    ChannelClient,
    ChannelClosed,
    ChannelServer,
    new_secret,
)
from workers.engine import EngineConfig

SECRET = new_secret()
METHODS = ("score", "big", "fail", "ok", "m")


def _echo(method: str, payload: bytes, *chained: bytes) -> bytes:
    if method == "fail":
        raise ValueError("the model broke")
    args = wire.loads(payload)
    return wire.dumps((method, args, [wire.loads(c) for c in chained]))


def _server(handler=_echo, **kwargs) -> ChannelServer:
    return ChannelServer(handler, secret=SECRET, host="127.0.0.1", methods=METHODS, **kwargs)


def _client(server, secret=SECRET, **kwargs) -> ChannelClient:
    return ChannelClient(server.address, secret=secret, methods=METHODS, **kwargs)


def _state(rows=3, gamma=4) -> decoding.DecodeState:
    return jax.device_get(
        decoding.init_state(
            np.arange(rows * 5, dtype=np.int32).reshape(rows, 5),
            np.full(rows, 5, np.int32),
            np.arange(rows, dtype=np.uint32),
            seed=7,
            max_new_tokens=9,
            gamma=gamma,
        )
    )


def _assert_same(a, b):
    """Equal values of equal types, arrays compared by dtype, shape and bytes."""
    assert type(a) is type(b), (type(a), type(b))
    if isinstance(a, np.ndarray | np.generic):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, tuple | list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _assert_same(x, y)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif dataclasses.is_dataclass(a):
        for field in dataclasses.fields(a):
            _assert_same(getattr(a, field.name), getattr(b, field.name))
    elif isinstance(a, float) and a != a:
        assert b != b  # NaN
    else:
        assert a == b


# --- the wire format ---------------------------------------------------------------


def test_wire_round_trips_every_registered_class_and_plain_value():
    settings = DecodeSettings(
        gamma=3,
        sampling=SamplingConfig(temperature=0.7, top_k=5, top_p=0.9),
        seed=11,
        eos_id=None,
        max_new_tokens=17,
        batch_size=2,
    )
    values = [
        _state(),
        settings,
        GREEDY,
        None,
        True,
        False,
        0,
        -(2**63),
        2**63 - 1,
        2**200,
        -(3**90),
        1.5,
        float("inf"),
        float("nan"),
        "",
        "ünïcode ✓",
        b"",
        bytes(range(256)),
        (),
        [],
        {},
        {"a": [1, (2.0, None)], "b": {"c": b"x"}},
        ("id", [1, 2], (3,)),
    ]
    for value in values:
        _assert_same(wire.loads(wire.dumps(value)), value)
    # A real iteration's payload in one blob, as the coordinator sends it.
    payload = ("batch", _state(), np.ones((3, 4), np.int32), np.zeros((3, 4), np.float32), settings)
    _assert_same(wire.loads(wire.dumps(payload)), payload)


def test_wire_round_trips_arrays_of_every_allowed_dtype_and_numpy_scalars():
    rng = np.random.default_rng(0)
    dtypes = [
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.uint16,
        np.uint32,
        np.uint64,
        np.float16,
        np.float32,
        np.float64,
        ml_dtypes.bfloat16,
    ]
    for dtype in dtypes:
        for shape in [(), (0,), (7,), (2, 3, 4), (3, 0, 2)]:
            array = rng.integers(0, 2, shape) if dtype is np.bool_ else rng.normal(size=shape)
            array = np.asarray(array).astype(dtype)
            back = wire.loads(wire.dumps(array))
            _assert_same(back, array)
            if back.size:
                back.flat[0] = back.flat[-1]  # writable, as an unpickled array would be
        _assert_same(wire.loads(wire.dumps(np.asarray(3).astype(dtype)[()])), dtype(3))
    strided = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]  # not contiguous
    _assert_same(wire.loads(wire.dumps(strided)), np.ascontiguousarray(strided))
    big_endian = np.arange(5, dtype=">i4")
    back = wire.loads(wire.dumps(big_endian))
    assert back.dtype == np.dtype("<i4") and back.tolist() == [0, 1, 2, 3, 4]
    device = jax.numpy.arange(6, dtype=jax.numpy.float32).reshape(2, 3)  # jax -> numpy
    _assert_same(wire.loads(wire.dumps(device)), np.arange(6, dtype=np.float32).reshape(2, 3))


class _Marker:
    """Would create a file when unpickled."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (pathlib.Path.touch, (pathlib.Path(self.path),))


@dataclasses.dataclass(frozen=True)
class _Unregistered:
    x: int = 1


def test_wire_refuses_types_it_does_not_carry_and_names_them(tmp_path):
    refused = {
        "_Unregistered": _Unregistered(),
        "_Marker": _Marker(tmp_path / "m"),
        "set": {1, 2},
        "complex": 1j,
        "function": print,
        "object": np.array([1, "a"], dtype=object),
        "complex128": np.zeros(2, np.complex128),
        "<U3": np.array(["abc"]),
        "datetime64": np.zeros(2, "datetime64[s]"),
    }
    for name, value in refused.items():
        with pytest.raises(wire.WireError, match=name):
            wire.dumps(value)
        with pytest.raises(wire.WireError, match=name):
            wire.dumps(("nested", [value]))  # anywhere in the value
    with pytest.raises(wire.WireError, match="dict keys must be str, got int"):
        wire.dumps({1: 2})
    nested: list = []
    for _ in range(wire.MAX_DEPTH + 1):
        nested = [nested]
    with pytest.raises(wire.WireError, match="deeper"):
        wire.dumps(nested)
    assert not (tmp_path / "m").exists()


def test_wire_decoding_rejects_truncated_and_lying_blobs_without_allocating():
    blob = wire.dumps(("batch", _state(), np.ones((3, 4), np.float32), DecodeSettings()))
    for cut in range(len(blob)):  # every truncation is caught, none crashes
        with pytest.raises(wire.WireDecodeError):
            wire.loads(blob[:cut])
    with pytest.raises(wire.WireDecodeError, match="stray bytes"):
        wire.loads(blob + b"\0")
    u32, u64 = struct.Struct("<I").pack, struct.Struct("<Q").pack
    lies = {
        # an array of 2**40 x 2**40 float32 in a 30-byte blob
        "truncated blob: a float32 array": b"\x01a\x0a\x02" + u64(2**40) * 2 + b"\0" * 8,
        "claims 4294967295 items": b"\x01t" + u32(2**32 - 1) + b"N",
        "truncated blob: a str needs 2147483648": b"\x01s" + u32(2**31) + b"abc",
        "unknown dtype code 200": b"\x01a\xc8\x01" + u64(1) + b"\0",
        "an array of 200 dimensions": b"\x01a\x03\xc8",
        "unknown tag 0x80": b"\x01\x80",
        "version 128": pickle.dumps(("x", 1)),
        "not registered": b"\x01c" + u32(9) + b"os.system" + u32(0),
        "bool array holds bytes other than 0 and 1": b"\x01a\x00\x01" + u64(2) + b"\x00\x07",
        "an int of 100000 bytes": b"\x01I" + u32(100_000),
        "not UTF-8": b"\x01s" + u32(2) + b"\xff\xfe",
    }
    for message, lie in lies.items():
        with pytest.raises(wire.WireDecodeError, match=message):
            wire.loads(lie)
    nested = b"\x01" + (b"t" + u32(1)) * (wire.MAX_DEPTH + 2) + b"N"
    with pytest.raises(wire.WireDecodeError, match="deeper"):
        wire.loads(nested)


def test_wire_rebuilds_classes_through_their_own_validation():
    good = wire.dumps(SamplingConfig(temperature=0.5, top_p=0.5))
    forged = good.replace(struct.pack("<d", 0.5), struct.pack("<d", -1.0), 1)
    with pytest.raises(wire.WireDecodeError, match=r"SamplingConfig rejected.*temperature"):
        wire.loads(forged)
    renamed = good.replace(b"top_k", b"top_z")
    with pytest.raises(wire.WireDecodeError, match="expected field 'top_k'"):
        wire.loads(renamed)


def test_wire_decoding_random_and_mutated_blobs_raises_only_wire_errors():
    """Any other exception (IndexError, struct.error, MemoryError...) fails the test."""
    rng = np.random.default_rng(1)
    blob = bytearray(wire.dumps(("batch", _state(), DecodeSettings(), {"k": [1.0, b"x"]})))
    rejected = 0
    for _ in range(3000):
        garbage = rng.integers(0, 256, rng.integers(0, 200), dtype=np.uint8).tobytes()
        mutated = bytearray(blob)
        for position in rng.integers(0, len(blob), rng.integers(1, 4)):
            mutated[position] = rng.integers(0, 256)
        for candidate in (b"\x01" + garbage, bytes(mutated)):
            try:
                wire.loads(candidate)
            except wire.WireDecodeError:
                rejected += 1
    assert rejected > 3000  # nearly all garbage, and many mutations, are refused


# --- the channel -------------------------------------------------------------------


def test_calls_round_trip_with_chained_results_in_order():
    server = _server()
    client = _client(server, name="target worker")
    try:
        for i in range(50):
            blob = client.call("score", wire.dumps(("b", i)), wire.dumps((i, i + 1)))
            assert wire.loads(blob) == ("score", ("b", i), [(i, i + 1)])
        big = bytes(range(256)) * 40_000  # 10 MB: frames longer than a socket buffer
        assert wire.loads(client.call("big", wire.dumps(big)))[1] == big
        with pytest.raises(ValueError, match="'nope' is not a channel method"):
            client.call("nope", wire.dumps(()))
    finally:
        client.close()
        server.close()


def test_worker_errors_come_back_named_and_the_channel_survives():
    server = _server()
    client = _client(server, name="draft worker")
    try:
        with pytest.raises(
            ChannelCallError, match=r"draft worker failed in 'fail'.*the model broke"
        ):
            client.call("fail", wire.dumps(()))
        assert wire.loads(client.call("ok", wire.dumps(1)))[1] == 1
    finally:
        client.close()
        server.close()


def test_a_worker_that_goes_away_mid_call_raises_channel_closed():
    """The server authenticates, reads the request and dies without answering."""
    listener = socket.create_server(("127.0.0.1", 0))

    def die_after_reading():
        conn, _ = listener.accept()
        server_nonce = os.urandom(32)
        conn.sendall(channel._HELLO + server_nonce)
        answer = channel._recv_exactly(conn, 64)
        proof = channel._digest(SECRET, channel._SERVER_LABEL, answer[32:], server_nonce)
        conn.sendall(proof)
        conn.recv(64)
        conn.close()

    thread = threading.Thread(target=die_after_reading, daemon=True)
    thread.start()
    client = ChannelClient(listener.getsockname()[:2], secret=SECRET, name="target worker")
    with pytest.raises(ChannelClosed, match="target worker went away during 'score'"):
        client.call("score", wire.dumps(()))
    thread.join(5)
    listener.close()


def test_connecting_to_nothing_raises_channel_closed():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        address = probe.getsockname()[:2]
    with pytest.raises(ChannelClosed, match="cannot connect to the target worker"):
        ChannelClient(address, secret=SECRET, name="target worker", timeout=2)


def test_the_client_refuses_a_server_without_the_secret():
    """Authentication goes both ways: an impostor listening on the port is refused."""
    impostor = ChannelServer(_echo, secret=new_secret(), host="127.0.0.1", methods=METHODS)
    try:
        with pytest.raises(ChannelClosed, match="refused the secret"):
            _client(impostor, timeout=5)
    finally:
        impostor.close()
    listener = socket.create_server(("127.0.0.1", 0))

    def bluff():  # answers the challenge with bytes of its own
        conn, _ = listener.accept()
        conn.sendall(channel._HELLO + os.urandom(32))
        channel._recv_exactly(conn, 64)
        conn.sendall(os.urandom(32))
        conn.recv(1)
        conn.close()

    thread = threading.Thread(target=bluff, daemon=True)
    thread.start()
    with pytest.raises(ChannelClosed, match="does not hold the job's secret"):
        ChannelClient(listener.getsockname()[:2], secret=SECRET, timeout=5)
    thread.join(5)
    listener.close()


def test_two_clients_are_served_one_call_at_a_time():
    inside = []
    lock = threading.Lock()

    def handler(method, payload):
        with lock:
            inside.append(+1)
            assert sum(inside) == 1, "two calls inside the handler at once"
        threading.Event().wait(0.002)
        with lock:
            inside.append(-1)
        return payload

    server = _server(handler)
    errors = []

    def hammer():
        client = _client(server)
        try:
            for i in range(30):
                assert wire.loads(client.call("m", wire.dumps(i))) == i
        except Exception as error:  # reported below
            errors.append(error)
        finally:
            client.close()

    threads = [threading.Thread(target=hammer) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    server.close()
    assert not errors
    assert len(inside) == 2 * 90


def test_secrets_must_be_real_secrets():
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ChannelServer(_echo, secret=b"short", host="127.0.0.1")
    with pytest.raises(ValueError, match="at least 16 bytes"):
        ChannelClient(("127.0.0.1", 1), secret="a str secret of some length")


def test_the_channel_binds_to_loopback_unless_configured(monkeypatch):
    assert channel.bind_host() == "127.0.0.1"  # no Ray, or a local Ray cluster
    server = ChannelServer(_echo, secret=SECRET)
    assert server.address[0] == "127.0.0.1"
    server.close()
    monkeypatch.setenv(channel.HOST_ENV, "0.0.0.0")
    assert channel.bind_host() == "0.0.0.0"


# --- hostile clients ---------------------------------------------------------------


def _frame(kind, method_id, payload, *, length=None) -> bytes:
    header = channel._HEADER.pack(
        channel._MAGIC,
        channel._VERSION,
        kind,
        method_id,
        len(payload) if length is None else length,
    )
    return header + payload


def _raw(address, secret=None, timeout=10.0) -> socket.socket:
    """A raw connection, authenticated when ``secret`` is given."""
    sock = socket.create_connection(tuple(address), timeout=timeout)
    if secret is not None:
        hello = channel._recv_exactly(sock, len(channel._HELLO) + 32)
        server_nonce, client_nonce = hello[len(channel._HELLO) :], os.urandom(32)
        digest = channel._digest(secret, channel._CLIENT_LABEL, server_nonce, client_nonce)
        sock.sendall(digest + client_nonce)
        channel._recv_exactly(sock, 32)
    return sock


def _closed_by_peer(sock: socket.socket, timeout=10.0) -> bool:
    """Whether the server closed the connection (EOF, or a reset) within ``timeout``."""
    sock.settimeout(timeout)
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                return True
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    finally:
        sock.close()


def _evil_pickle(marker: pathlib.Path) -> bytes:
    """A pickle that creates ``marker`` when loaded (checked once, for real, first)."""
    evil = pickle.dumps(_Marker(marker))
    pickle.loads(evil)
    assert marker.exists(), "the payload must be one that runs code when unpickled"
    marker.unlink()
    return evil


def _attacks(address, evil: bytes, *, wrong_secret: bytes) -> dict:
    """Each attack on a worker's port: name -> a connection the server should close."""
    rng = np.random.default_rng(3)
    conns = {}
    # A client that does not know of the handshake: a request frame at once.
    sock = _raw(address)
    sock.sendall(_frame(1, 0, wire.dumps((wire.dumps(("b",)),))) + b"\0" * 64)
    conns["no secret"] = sock
    sock = _raw(address)
    sock.sendall(evil + b"\0" * 64)
    conns["pickle, unauthenticated"] = sock
    sock = _raw(address)
    hello = channel._recv_exactly(sock, len(channel._HELLO) + 32)
    nonce = os.urandom(32)
    sock.sendall(channel._digest(wrong_secret, channel._CLIENT_LABEL, hello[-32:], nonce) + nonce)
    conns["wrong secret"] = sock
    sock = _raw(address)
    sock.sendall(rng.integers(0, 256, 5000, dtype=np.uint8).tobytes())
    conns["garbage, unauthenticated"] = sock
    sock = _raw(address)
    sock.sendall(b"\0" * 20)
    sock.shutdown(socket.SHUT_WR)
    conns["truncated handshake"] = sock
    return conns


def _authenticated_attacks(address, secret, evil: bytes, max_frame: int) -> dict:
    """Attacks from a client that holds the secret: malformed frames of every kind."""
    rng = np.random.default_rng(4)
    conns = {}
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, evil))
    conns["pickle as the payload"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, wire.dumps((evil,))))
    conns["pickle as an argument blob"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, b"\x01" * 40, length=100))
    sock.shutdown(socket.SHUT_WR)
    conns["truncated frame"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, b"", length=max_frame + 1))  # and nothing more
    conns["oversized header"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, b"", length=2**63))
    conns["2**63-byte header"] = sock
    sock = _raw(address, secret)
    sock.sendall(rng.integers(0, 256, 3000, dtype=np.uint8).tobytes())
    conns["garbage frames"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 250, wire.dumps((b"",))))
    conns["unknown method id"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(2, 1, wire.dumps((b"",))))
    conns["a reply sent as a request"] = sock
    sock = _raw(address, secret)
    sock.sendall(_frame(1, 1, wire.dumps(("not bytes",))))
    conns["a request that is not blobs"] = sock
    return conns


def test_hostile_clients_are_closed_logged_and_run_nothing(tmp_path, caplog):
    marker = tmp_path / "pwned"
    server = _server(max_frame=1 << 20)
    bystander = _client(server)  # connected before the attacks, used after them
    caplog.set_level(logging.WARNING, logger="specdec.channel")
    try:
        evil = _evil_pickle(marker)
        conns = _attacks(server.address, evil, wrong_secret=new_secret())
        conns.update(_authenticated_attacks(server.address, SECRET, evil, 1 << 20))
        closed = {name: _closed_by_peer(sock) for name, sock in conns.items()}
        assert closed == dict.fromkeys(conns, True)
        assert not marker.exists(), "a pickle received on the channel was loaded"
        warnings = [r for r in caplog.records if r.name == "specdec.channel"]
        assert len(warnings) == len(conns), [r.getMessage() for r in warnings]
        text = "\n".join(r.getMessage() for r in warnings)
        for reason in [
            "authentication failed",
            "truncated frame of 100 bytes",
            f"frame of {(1 << 20) + 1} bytes exceeds the limit",
            "exceeds the limit",
            "malformed request payload",
            "malformed argument of 'big'",
            "wire format version 128",
            "not a request (kind 1, method id 250)",
            "not a request (kind 2",
            "not a tuple of blobs",
            "not a channel frame",
        ]:
            assert reason in text, reason
        # The server goes on: the bystander and a newcomer get correct answers.
        assert wire.loads(bystander.call("ok", wire.dumps(7))) == ("ok", 7, [])
        newcomer = _client(server)
        assert wire.loads(newcomer.call("score", wire.dumps((1,)), wire.dumps(2))) == (
            "score",
            (1,),
            [2],
        )
        newcomer.close()
    finally:
        bystander.close()
        server.close()


def test_a_client_with_a_wrong_secret_is_refused_and_logged(caplog):
    server = _server()
    caplog.set_level(logging.WARNING, logger="specdec.channel")
    try:
        with pytest.raises(ChannelClosed, match="refused the secret"):
            _client(server, secret=new_secret(), timeout=5)
        assert "authentication failed" in caplog.text
        assert wire.loads(_client(server).call("ok", wire.dumps(1))) == ("ok", 1, [])
    finally:
        server.close()


@pytest.mark.slow
def test_a_ray_job_completes_identically_while_its_workers_ports_are_attacked(ray_local, tmp_path):
    """Real workers (transport "socket", the draft in its own actor), a hostile client
    on both workers' ports during the job: the same tokens as the in-process engine."""
    from tests.test_workers import CONFIG, _inprocess, _requests
    from workers.ray_engine import RayEngine
    from workers.spec import ModelSpec

    settings = DecodeSettings(
        gamma=3, sampling=SamplingConfig(temperature=1.0), seed=9, max_new_tokens=12, batch_size=2
    )
    reqs = _requests(6, offset=40)
    engine = RayEngine(
        ModelSpec(name="target", family="t5", config=CONFIG, init_seed=0),
        ModelSpec(name="draft", family="t5", config=CONFIG, init_seed=1),
        settings,
        config=EngineConfig(kind="ray", draft_placement="worker", transport="socket"),
    )
    markers = [tmp_path / "pwned-target", tmp_path / "pwned-draft"]
    stop = threading.Event()
    outcomes: list = []

    def attack(address, secret, evil):
        """Without the secret, with a wrong one, and malformed frames with the right one
        (a client that holds it still cannot make the worker load a pickle)."""
        while not stop.is_set():
            conns = _attacks(address, evil, wrong_secret=new_secret())
            conns.update(_authenticated_attacks(address, secret, evil, channel.MAX_FRAME))
            outcomes.extend((name, _closed_by_peer(s, 60)) for name, s in conns.items())
            stop.wait(0.05)

    try:
        assert engine.transport == "socket"
        secret = engine._channel_secret
        addresses = ray_local.get(
            [engine.target.open_channel.remote(secret), engine.draft.open_channel.remote(secret)]
        )
        assert all(host == "127.0.0.1" for host, _ in addresses)  # a local cluster
        attackers = [
            threading.Thread(target=attack, args=(a, secret, _evil_pickle(m)), daemon=True)
            for a, m in zip(addresses, markers, strict=True)
        ]
        for thread in attackers:
            thread.start()
        remote = [g for i in range(0, len(reqs), 2) for g in engine.generate(reqs[i : i + 2])]
        stop.set()
        for thread in attackers:
            thread.join(60)
        remote += engine.generate(reqs[:2])  # and after the attacks
    finally:
        stop.set()
        engine.close()
    assert outcomes and [name for name, closed in outcomes if not closed] == []
    assert not any(m.exists() for m in markers)
    local = _inprocess(settings)
    expected = [g for i in range(0, len(reqs), 2) for g in local.generate(reqs[i : i + 2])]
    expected += local.generate(reqs[:2])
    assert [g.tokens for g in remote] == [g.tokens for g in expected]
    assert [g.accepted for g in remote] == [g.accepted for g in expected]
