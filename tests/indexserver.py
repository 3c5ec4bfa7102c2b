"""A tiny package index over HTTP for tests: ``python -m tests.indexserver ROOT [USER PASSWORD]``.

Serves the files under ROOT on 127.0.0.1 (a random port, printed on the first line of stdout).
A project page ``/simple/NAME/`` is ROOT/simple/NAME/index.json as PEP 691 JSON when the client
accepts it and the file exists, else index.html. With USER and PASSWORD every request needs
that basic auth (401 otherwise). Each request is logged to stderr as ``PATH AUTH`` (AUTH: yes/no).
It also answers as an HTTP forward proxy: ``GET http://ANY-HOST/PATH`` serves ROOT's PATH
(logged with the full URL), so a test can tell that a client went through its proxy.
A path listed in ROOT/redirects.json (``{"/path": "http://elsewhere/x"}``) answers 302 there.
With INDEX_TLS_CERT and INDEX_TLS_KEY in the environment it speaks HTTPS with that certificate.
"""

from __future__ import annotations

import base64
import json
import os
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

ROOT = Path(sys.argv[1]).resolve()
AUTH = (
    base64.b64encode(f"{sys.argv[2]}:{sys.argv[3]}".encode()).decode()
    if len(sys.argv) > 3
    else None
)


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        sent = self.headers.get("Authorization")
        sys.stderr.write(f"{self.path} {'yes' if sent else 'no'}\n")
        sys.stderr.flush()
        if AUTH and sent != f"Basic {AUTH}":
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="index"')
            self.end_headers()
            return
        local = urlsplit(self.path).path  # a proxy request's absolute URL, or a plain path
        redirects = ROOT / "redirects.json"
        if redirects.is_file() and local in (moved := json.loads(redirects.read_text())):
            self.send_response(302)
            self.send_header("Location", moved[local])
            self.end_headers()
            return
        path = (ROOT / local.lstrip("/")).resolve()
        content_type = "application/octet-stream"
        if path.is_dir():
            wants_json = "application/vnd.pypi.simple.v1+json" in self.headers.get("Accept", "")
            if wants_json and (path / "index.json").is_file():
                path, content_type = path / "index.json", "application/vnd.pypi.simple.v1+json"
            else:
                path, content_type = path / "index.html", "text/html"
        if not path.is_relative_to(ROOT) or not path.is_file():
            self.send_response(404)
            self.end_headers()
            return
        body = path.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    if os.environ.get("INDEX_TLS_CERT"):
        tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        tls.load_cert_chain(os.environ["INDEX_TLS_CERT"], os.environ["INDEX_TLS_KEY"])
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    print(server.server_address[1], flush=True)
    server.serve_forever()
