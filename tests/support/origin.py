"""A model source on loopback for tests that fetch over http: `Files` serves what its class
holds and records each request's Authorization header; `served` runs a handler class on a
free port for the length of a `with`."""

from __future__ import annotations

import contextlib
import http.server
import io
import tarfile
import threading
from collections.abc import Iterator
from typing import ClassVar

from tests.support.agent_harness import EXAMPLES


class Files(http.server.BaseHTTPRequestHandler):
    files: ClassVar[dict[str, bytes]] = {}
    #: The Authorization header of every request, in order.
    authorizations: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        self.authorizations.append(self.headers.get("Authorization"))
        body = self.files.get(self.path)
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def served(handler: type[http.server.BaseHTTPRequestHandler]) -> Iterator[str]:
    """`handler` on a free loopback port; yields its base URL and stops it on exit."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def mlp_archive() -> bytes:
    """examples/models/mlp as a .tar.gz, as a source serves it."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        tar.add(EXAMPLES / "mlp", arcname="mlp")
    return buffer.getvalue()
