"""A fault-injecting HTTP/1.1 proxy in front of the real dispatchd: each connection takes the
next scripted action (answer 503, drop the connection, forward but lose the answer, forward a
stream and cut it after N events), then plain forwarding. Every request is recorded, so a test
can check what the client sent (its Idempotency-Key, its Last-Event-ID)."""
from __future__ import annotations

import socket
import threading
import urllib.parse
from dataclasses import dataclass, field
from typing import Dict, List, Optional


@dataclass
class Seen:
    method: str
    path: str
    headers: Dict[str, str]
    body: bytes
    action: str


@dataclass
class FaultProxy:
    upstream: str
    script: List[str] = field(default_factory=list)
    seen: List[Seen] = field(default_factory=list)

    def __post_init__(self) -> None:
        u = urllib.parse.urlsplit(self.upstream)
        self._up = (u.hostname or "127.0.0.1", u.port or 80)
        self._lock = threading.Lock()
        self._sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._sock.getsockname()[1]}"
        threading.Thread(target=self._accept, daemon=True).start()

    def close(self) -> None:
        self._sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            head, body = _read_request(conn)
            if head is None:
                return
            lines = head.decode("latin-1").split("\r\n")
            method, path, _ = lines[0].split(" ", 2)
            headers = {k.strip().lower(): v.strip() for k, _, v in (l.partition(":") for l in lines[1:] if l)}
            with self._lock:
                action = self.script.pop(0) if self.script else "forward"
                self.seen.append(Seen(method, path, headers, body, action))
            if action == "503":
                msg = b'{"error":{"code":"database_unavailable","message":"scripted"}}'
                conn.sendall(b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(msg) + msg)
                return
            if action == "drop":
                return
            # Forward, one request per upstream connection.
            out = [l for l in lines if not l.lower().startswith("connection:")]
            out = out[:-1] if out and out[-1] == "" else out
            request = ("\r\n".join(out) + "\r\nConnection: close\r\n\r\n").encode("latin-1") + body
            with socket.create_connection(self._up) as up:
                up.sendall(request)
                if action == "lose-answer":
                    while up.recv(65536):
                        pass  # the server answered (and committed); the client never hears it
                    return
                cut = int(action.split(":")[1]) if action.startswith("cut-after:") else None
                events = 0
                while True:
                    chunk = up.recv(65536)
                    if not chunk:
                        return
                    if cut is not None:
                        events += chunk.count(b"\nid: ") + (1 if chunk.startswith(b"id: ") else 0)
                        if events >= cut:
                            # Send up to the end of the cut-th event, then drop the connection.
                            conn.sendall(_through_event(chunk, cut - (events - _count(chunk))))
                            return
                    conn.sendall(chunk)


def _count(chunk: bytes) -> int:
    return chunk.count(b"\nid: ") + (1 if chunk.startswith(b"id: ") else 0)


def _through_event(chunk: bytes, n: int) -> bytes:
    """The chunk up to the blank line ending its n-th event."""
    pos = 0
    for _ in range(n):
        i = chunk.find(b"id: ", pos)
        pos = i + 1
    end = chunk.find(b"\n\n", pos)
    return chunk if end < 0 else chunk[: end + 2]


def _read_request(conn: socket.socket):
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = conn.recv(65536)
        if not chunk:
            return None, b""
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        k, _, v = line.partition(b":")
        if k.strip().lower() == b"content-length":
            length = int(v.strip())
    while len(rest) < length:
        chunk = conn.recv(65536)
        if not chunk:
            break
        rest += chunk
    return head, rest
