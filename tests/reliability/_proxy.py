"""A TCP proxy on 127.0.0.1 that a test can cut (every connection closed, new ones refused) and restore.

Not a test module. It stands between a service and a shared dependency (PostgreSQL, Redis)
so that the dependency can "go away" without touching it: `cut()` closes the listening socket
(new connections are refused, as by a server that is down) and every proxied connection (a
client in the middle of a query reads EOF or a reset); `restore()` listens again on the same
port. One thread accepts, one thread per connection pumps both directions with `select`.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from types import TracebackType

HOST = "127.0.0.1"
_CHUNK = 65536


class CutProxy:
    """Forward 127.0.0.1:`port` (any free port by default) to `target_host`:`target_port`."""

    def __init__(self, target_host: str, target_port: int, port: int = 0) -> None:
        self.target = (target_host, target_port)
        self.port = port
        self._lock = threading.Lock()
        self._listener: socket.socket | None = None
        self._pairs: set[tuple[socket.socket, socket.socket]] = set()
        self._threads: list[threading.Thread] = []
        self.accepted = 0  # connections proxied so far
        self.cut_at: float | None = None  # time.time() of the last cut
        self.restored_at: float | None = None

    # --- lifecycle ------------------------------------------------------------------------------

    def start(self) -> CutProxy:
        self._listen()
        return self

    def close(self) -> None:
        self.cut()

    def __enter__(self) -> CutProxy:
        return self.start()

    def __exit__(self, *exc: tuple[type[BaseException] | None, BaseException | None, TracebackType | None]) -> None:
        self.close()

    @property
    def up(self) -> bool:
        return self._listener is not None

    def cut(self) -> None:
        """Refuse new connections and close every open one, now."""
        with self._lock:
            listener, self._listener = self._listener, None
            pairs, self._pairs = self._pairs, set()
        if listener is not None:
            try:  # wakes the thread blocked in accept(): until it returns, the port would still be listening
                listener.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            _close(listener)
        for client, upstream in pairs:
            for sock in (client, upstream):
                _reset(sock)
        self.cut_at = time.time()

    def restore(self) -> None:
        """Accept connections again, on the same port."""
        self._listen()
        self.restored_at = time.time()

    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    # --- the proxy --------------------------------------------------------------------------------

    def _listen(self) -> None:
        with self._lock:
            if self._listener is not None:
                return
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind((HOST, self.port))
            listener.listen(128)
            self.port = listener.getsockname()[1]
            self._listener = listener
        thread = threading.Thread(target=self._accept, args=(listener,), name=f"proxy-accept-{self.port}", daemon=True)
        thread.start()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:  # cut: the listener was closed
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _reset(client)
                continue
            with self._lock:
                if self._listener is not listener:  # cut meanwhile
                    _reset(client)
                    _reset(upstream)
                    return
                self._pairs.add((client, upstream))
                self.accepted += 1
            thread = threading.Thread(target=self._pump, args=(client, upstream), name="proxy-pump", daemon=True)
            thread.start()

    def _pump(self, client: socket.socket, upstream: socket.socket) -> None:
        peer = {client: upstream, upstream: client}
        try:
            while True:
                readable, _, _ = select.select([client, upstream], [], [], 1.0)
                for sock in readable:
                    data = sock.recv(_CHUNK)
                    if not data:
                        return
                    peer[sock].sendall(data)
        except (OSError, ValueError):  # closed by cut(), or by either side
            return
        finally:
            with self._lock:
                self._pairs.discard((client, upstream))
            _close(client)
            _close(upstream)


def _reset(sock: socket.socket) -> None:
    """Close with a reset (SO_LINGER 0), waking a thread blocked on it."""
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    except OSError:
        pass
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    _close(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.close()
    except OSError:
        pass
