"""``--metrics-port``: a long-running command's counters in Prometheus' text format at
``/metrics``, served from a daemon thread."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def family(name: str, kind: str, help_text: str, samples: dict[str, int]) -> list[str]:
    """One metric family's lines; ``samples`` maps label text (``outcome="x"``, or "" for
    none) to the value."""
    return [
        f"# HELP {name} {help_text}",
        f"# TYPE {name} {kind}",
        *(
            f"{name}{{{labels}}} {value}" if labels else f"{name} {value}"
            for labels, value in samples.items()
        ),
    ]


def serve(text: Callable[[], str], host: str, port: int) -> ThreadingHTTPServer:
    """Start serving ``text()`` at /metrics; ``shutdown()`` the server returned to stop."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes are not news

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="idemctl-metrics", daemon=True).start()
    return server


@contextmanager
def serving(text: Callable[[], str], host: str, port: int | None) -> Iterator[None]:
    """``serve`` for the block when a port is given; nothing otherwise."""
    if port is None:
        yield
        return
    server = serve(text, host, port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
