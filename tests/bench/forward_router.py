"""A router of the tests' own, for `tandem bench --peer-command`: stdlib only, run as a script.

`python forward_router.py --host H --port P --model M BACKEND...` serves `GET /health` (200) and
forwards every other request to the backends in turn (round robin), streaming the answer back as it
comes (HTTP/1.0: the body ends when the connection closes). A request for another model than M gets
404, so a test can tell that `{model}` was filled in. Backends must be on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import http.client
import itertools
import json
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


def make_handler(backends: list[str], model: str) -> type[BaseHTTPRequestHandler]:
    turns = itertools.cycle(backends)
    lock = threading.Lock()

    class Forward(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # quiet: the bench reads no log
            pass

        def do_GET(self) -> None:
            if self.path == "/health":
                self._answer(200, b"ok")
            else:
                self._forward(b"")

        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("content-length") or 0))
            if json.loads(body or b"{}").get("model") != model:
                self._answer(404, b'{"error": {"message": "unknown model"}}')
                return
            self._forward(body)

        def _answer(self, status: int, body: bytes) -> None:
            self.send_response(status)
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self, body: bytes) -> None:
            with lock:
                backend = urllib.parse.urlsplit(next(turns))
            upstream = http.client.HTTPConnection(backend.hostname or "", backend.port, timeout=60)
            headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
            upstream.request(self.command, self.path, body=body or None, headers=headers)
            answer = upstream.getresponse()
            self.send_response(answer.status)
            for key, value in answer.getheaders():
                if key.lower() not in ("transfer-encoding", "connection", "content-length", "date", "server"):
                    self.send_header(key, value)
            self.end_headers()
            while chunk := answer.read1(65536):
                self.wfile.write(chunk)
                self.wfile.flush()
            upstream.close()

    return Forward


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("backends", nargs="+")
    args = parser.parse_args()
    if any(urllib.parse.urlsplit(b).hostname != "127.0.0.1" for b in args.backends):
        parser.error(f"backends must be on 127.0.0.1: {args.backends}")
    server = ThreadingHTTPServer((args.host, args.port), make_handler(args.backends, args.model))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
