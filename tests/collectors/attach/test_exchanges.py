"""Following outbound connections' requests and answers from the kernel's clocks (`sockdiag.Exchanges`):
real TCP connections on 127.0.0.1, read by sock_diag as `latprof attach` reads them, every 100 ms."""

from __future__ import annotations

import os
import socket
import threading
import time
from typing import Callable, Iterator

import pytest

from latprof.collectors.attach import sockdiag

LOCAL = "127.0.0.1"
ESTABLISHED = frozenset({"ESTABLISHED"})
POLL_S = 0.1  # the census's rate in `latprof attach`


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket, int]]:
    """A client connected to a listener of this process: (client, the server's end, the listening port)."""
    server = socket.socket()
    server.bind((LOCAL, 0))
    server.listen(4)
    client = socket.create_connection(server.getsockname())
    accepted, _ = server.accept()
    yield client, accepted, server.getsockname()[1]
    for s in (client, accepted, server):
        s.close()


def follow(client: socket.socket, port: int, seconds: float, exchanges: sockdiag.Exchanges) -> None:
    """Read the census of `client`'s connection every POLL_S for `seconds`, as the attach session does."""
    mine = {os.fstat(client.fileno()).st_ino}
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        exchanges.update(sockdiag.tcp_sockets(os.getpid(), states=ESTABLISHED), mine, {port}, time.time_ns())
        time.sleep(POLL_S)


def serve(accepted: socket.socket, answer: Callable[[socket.socket], None], requests: int = 1) -> threading.Thread:
    def run() -> None:
        for _ in range(requests):
            accepted.recv(4096)
            answer(accepted)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_streamed_answer_is_split_into_the_wait_for_its_first_token_and_the_stream(pair) -> None:
    """Like an LLM provider: the response's head at once, 400 ms before the first token, then
    16 tokens 30 ms apart (480 ms); then the connection's next request ends the exchange."""
    client, accepted, port = pair

    def stream(s: socket.socket) -> None:
        s.sendall(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\n")
        time.sleep(0.4)
        for _ in range(16):
            s.sendall(b"data: {\"token\": \"hi\"}\n\n")
            time.sleep(0.03)

    exchanges = sockdiag.Exchanges()
    server = serve(accepted, stream, requests=2)
    client.sendall(b"POST /v1/chat/completions")
    follow(client, port, 1.3, exchanges)
    client.sendall(b"POST /v1/chat/completions")  # the next request: the first exchange ended
    follow(client, port, 0.15, exchanges)
    (times,) = exchanges.take().values()
    assert (times.exchanges, times.streamed) == (1, 1)
    # 400 ms to the first token and 480 ms of stream, each read to within a census interval
    assert 0.3 <= times.first_byte_s <= 0.5, times
    assert 0.38 <= times.stream_s <= 0.58, times
    exchanges.close(time.time_ns())  # the capture ends with the second request waiting for its answer
    (second,) = exchanges.take().values()
    assert second.exchanges == 1 and second.stream_s == 0.0 and 0.05 <= second.first_byte_s <= 0.6, second
    server.join(5)


def test_an_answer_sent_whole_is_waiting_for_its_first_byte_to_within_a_census_interval(pair) -> None:
    """A call that is not streamed (a tool, or an LLM asked for the whole answer): 300 ms, then all of it."""
    client, accepted, port = pair

    def whole(s: socket.socket) -> None:
        time.sleep(0.3)
        s.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")

    exchanges = sockdiag.Exchanges()
    server = serve(accepted, whole)
    client.sendall(b"GET /lookup")
    follow(client, port, 0.6, exchanges)
    server.join(5)
    exchanges.update([], set(), {port}, time.time_ns())  # the connection is gone: its exchange ended
    (times,) = exchanges.take().values()
    assert (times.exchanges, times.streamed) == (1, 0)
    # the wire cannot tell an answer sent whole from a stream shorter than a census interval: its
    # first bytes are put halfway since the reading before, so at most an interval is "stream"
    assert 0.18 <= times.first_byte_s <= 0.35 and times.stream_s <= POLL_S + 0.02, times
    assert abs(times.first_byte_s + times.stream_s - 0.3) <= 0.05, times
