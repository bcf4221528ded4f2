#!/usr/bin/python3
"""A local HTTP/1.1 receiver for Dispatch's cancel webhook tests.

Records every request (path, headers, raw body) and answers as scripted: a
status, a delayed status, or a dropped connection.  Standard library only.
See README.md beside this file.
"""

import argparse
import json
import socket
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

lock = threading.Lock()
records = []
script = {"respond": [], "otherwise": {"status": 200}}


def next_answer():
    with lock:
        if script["respond"]:
            return script["respond"].pop(0)
        return dict(script["otherwise"])


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):
        pass

    def _json(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/_requests":
            with lock:
                return self._json(200, {"requests": list(records)})
        self._json(404, {"error": "no such path"})

    def do_DELETE(self):
        if self.path == "/_requests":
            with lock:
                records.clear()
            return self._json(200, {})
        self._json(404, {"error": "no such path"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        if self.path == "/_script":
            new = json.loads(body)
            with lock:
                script["respond"] = list(new.get("respond", []))
                script["otherwise"] = new.get("otherwise", {"status": 200})
            return self._json(200, {})
        answer = next_answer()
        record = {
            "time": time.time(),
            "path": self.path,
            "headers": {k.lower(): v for k, v in self.headers.items()},
            "body": body.decode("utf-8", "replace"),
            "answer": answer,
        }
        with lock:
            records.append(record)
        if answer.get("action") == "drop":
            # Close at once, answering nothing (RST, as a crashed receiver would).
            self.close_connection = True
            try:
                self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
            except OSError:
                pass
            self.connection.close()
            return
        if answer.get("action") == "delay":
            time.sleep(float(answer.get("seconds", 1)))
        status = int(answer.get("status", 200))
        text = answer.get("body", "ok")
        data = text.encode()
        try:
            self.send_response(status)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)
        except OSError:
            pass  # the sender gave up waiting (a late answer)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--ignore-stdin", action="store_true")
    a = p.parse_args()
    server = ThreadingHTTPServer((a.host, a.port), Handler)
    server.daemon_threads = True
    print(json.dumps({"port": server.server_address[1]}), flush=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    if a.ignore_stdin:
        threading.Event().wait()
    # Lives as long as the test holds our stdin open.
    sys.stdin.read()
    server.shutdown()


if __name__ == "__main__":
    main()
