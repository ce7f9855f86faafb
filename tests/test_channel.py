"""The direct channel between a coordinator and a worker (workers.channel), without Ray."""

import socket
import threading

import pytest

from workers import wire
from workers.channel import ChannelCallError, ChannelClient, ChannelClosed, ChannelServer


def _echo(method: str, payload: bytes, *chained: bytes) -> bytes:
    if method == "fail":
        raise ValueError("the model broke")
    args = wire.loads(payload)
    return wire.dumps((method, args, [wire.loads(c) for c in chained]))


def test_calls_round_trip_with_chained_results_in_order():
    server = ChannelServer(_echo, host="127.0.0.1")
    client = ChannelClient(server.address, name="target worker")
    try:
        for i in range(50):
            blob = client.call("score", wire.dumps(("b", i)), wire.dumps((i, i + 1)))
            assert wire.loads(blob) == ("score", ("b", i), [(i, i + 1)])
        big = bytes(range(256)) * 40_000  # 10 MB: frames longer than a socket buffer
        assert wire.loads(client.call("big", wire.dumps(big)))[1] == big
    finally:
        client.close()
        server.close()


def test_worker_errors_come_back_named_and_the_channel_survives():
    server = ChannelServer(_echo, host="127.0.0.1")
    client = ChannelClient(server.address, name="draft worker")
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
    """The server accepts, reads the request and dies without answering."""
    listener = socket.create_server(("127.0.0.1", 0))

    def die_after_reading():
        conn, _ = listener.accept()
        conn.recv(64)
        conn.close()

    thread = threading.Thread(target=die_after_reading, daemon=True)
    thread.start()
    client = ChannelClient(listener.getsockname()[:2], name="target worker")
    with pytest.raises(ChannelClosed, match="target worker went away during 'score'"):
        client.call("score", wire.dumps(()))
    thread.join(5)
    listener.close()


def test_connecting_to_nothing_raises_channel_closed():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        address = probe.getsockname()[:2]
    with pytest.raises(ChannelClosed, match="cannot connect to the target worker"):
        ChannelClient(address, name="target worker", timeout=2)


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

    server = ChannelServer(handler, host="127.0.0.1")
    errors = []

    def hammer():
        client = ChannelClient(server.address)
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
