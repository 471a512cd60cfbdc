"""A TCP proxy in front of a real service that can cut every connection for N seconds.

While cut, live connections are closed and new ones are refused (the listening socket is
closed), as a server restart or a network failure would do. Worker processes reach the
service through the proxy's port; a control port lets code inside those workers (a step's
body) ask for a cut at an exact moment: a line ``cut <seconds>`` answered with ``ok``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator


class CuttableProxy:
    def __init__(self, target_port: int, target_host: str = "127.0.0.1") -> None:
        self.target = (target_host, target_port)
        self.port = free_port()
        self._lock = threading.Lock()
        self._live: set[socket.socket] = set()
        self._listener: socket.socket | None = None
        self._restore_at = 0.0
        self._closed = False
        self.cuts: list[tuple[float, float]] = []
        self._open_listener()
        self._control = socket.create_server(("127.0.0.1", 0))
        self.control_port = self._control.getsockname()[1]
        threading.Thread(target=self._serve_control, daemon=True).start()
        threading.Thread(target=self._watch, daemon=True).start()

    # -- cutting --------------------------------------------------------------------------
    def cut(self, seconds: float) -> None:
        """Drop every connection now and refuse new ones for ``seconds``."""
        with self._lock:
            self._restore_at = time.monotonic() + seconds
            listener, self._listener = self._listener, None
            live, self._live = self._live, set()
            self.cuts.append((time.time(), seconds))
        if listener is not None:
            _close(listener)  # shutdown first: a bare close leaves a blocked accept() listening
        for sock in live:
            _close(sock)

    @property
    def is_cut(self) -> bool:
        return self._listener is None

    def wait_restored(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while self.is_cut and time.monotonic() < deadline:
            time.sleep(0.05)

    def close(self) -> None:
        self._closed = True
        self.cut(0)
        self._control.close()

    # -- plumbing -------------------------------------------------------------------------
    def _open_listener(self) -> None:
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", self.port))
        listener.listen(128)
        self._listener = listener
        threading.Thread(target=self._accept, args=(listener,), daemon=True).start()

    def _watch(self) -> None:
        while not self._closed:
            time.sleep(0.02)
            with self._lock:
                due = self._listener is None and time.monotonic() >= self._restore_at
                if due and not self._closed:
                    self._open_listener()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                _close(client)
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._listener is not listener:  # cut while connecting
                    _close(client)
                    _close(upstream)
                    continue
                self._live.update((client, upstream))
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=_pump, args=(source, sink), daemon=True).start()

    def _serve_control(self) -> None:
        while True:
            try:
                connection, _ = self._control.accept()
            except OSError:
                return
            with connection, connection.makefile("rw") as stream:
                words = stream.readline().split()
                if len(words) == 2 and words[0] == "cut":
                    self.cut(float(words[1]))
                stream.write("ok\n")
                stream.flush()


def request_cut(control_port: int, seconds: float) -> None:
    """From inside a worker: cut the proxy now (returns once the cut is in place)."""
    with socket.create_connection(("127.0.0.1", control_port), timeout=5) as connection:
        connection.sendall(f"cut {seconds}\n".encode())
        connection.recv(16)


@contextlib.contextmanager
def proxy(target_port: int) -> Iterator[CuttableProxy]:
    running = CuttableProxy(target_port)
    try:
        yield running
    finally:
        running.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    try:
        while True:
            data = source.recv(65536)
            if not data:
                break
            sink.sendall(data)
    except OSError:
        pass
    finally:
        _close(source)
        _close(sink)


def _close(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    with contextlib.suppress(OSError):
        sock.close()


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
