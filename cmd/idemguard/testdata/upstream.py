#!/usr/bin/env python3
"""An HTTP service that knows nothing of idempotency (standard library only).

Every POST appends one line to a file: that line is its side effect, and the
file is what a test counts. GET /healthz answers "ok".

    python3 upstream.py --port PORT --file FILE [--delay-ms N]

--delay-ms waits between appending the line and answering, so a process
killed meanwhile has acted without answering; a request's X-Delay-Ms header
sets that wait for it alone.
"""
import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

parser = argparse.ArgumentParser()
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--file", required=True)
parser.add_argument("--delay-ms", type=float, default=0)
args = parser.parse_args()

lock = threading.Lock()
fd = os.open(args.file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
with open(args.file, "rb") as f:
    lines = sum(1 for _ in f)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep connections alive, as real services do

    def answer(self, status, body, ctype="application/json"):
        data = body.encode()
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/healthz":
            self.answer(200, "ok\n", "text/plain")
        else:
            self.answer(404, '{"error":"not found"}')

    def do_POST(self):
        global lines
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n)
        if len(body) < n:
            # The connection closed mid-body (the gateway was killed while
            # sending it): an incomplete request, which a service does not
            # act on, as Node's server does not ('end' never comes).
            self.close_connection = True
            return
        try:
            order = str(json.loads(body or b"{}").get("order", ""))
        except (ValueError, AttributeError):
            self.answer(400, '{"error":"want a JSON object"}')
            return
        entry = {"order": order, "key": self.headers.get("Idempotency-Key", ""),
                 "server": "python", "pid": os.getpid()}
        with lock:
            os.write(fd, (json.dumps(entry) + "\n").encode())
            lines += 1
            line = lines
        delay_ms = float(self.headers.get("X-Delay-Ms") or args.delay_ms)
        if delay_ms:
            time.sleep(delay_ms / 1000)
        self.answer(201, json.dumps({"order": order, "line": line, "server": "python"}))

    def log_message(self, *a):
        pass


ThreadingHTTPServer.daemon_threads = True
ThreadingHTTPServer.request_queue_size = 256
server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
print("ready", flush=True)
try:
    server.serve_forever()
except KeyboardInterrupt:
    pass
