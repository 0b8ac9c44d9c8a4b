"""``--metrics-port``: the consumer's counters in Prometheus' text format at ``/metrics``."""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from idemctl.consume.loop import Summary

OUTCOMES = ("executed", "replayed", "dead_lettered", "retried", "busy", "store_unavailable",
            "lease_lost")  # fmt: skip


def render(summary: Summary) -> str:
    lines = [
        "# HELP idemctl_messages_total Messages by what became of them.",
        "# TYPE idemctl_messages_total counter",
        *(f'idemctl_messages_total{{outcome="{o}"}} {summary.counts[o]}' for o in OUTCOMES),
        "# HELP idemctl_paused_partitions Partitions held now (busy keys, retries, outages).",
        "# TYPE idemctl_paused_partitions gauge",
        f"idemctl_paused_partitions {summary.paused}",
    ]
    return "\n".join(lines) + "\n"


def serve(summary: Callable[[], Summary], host: str, port: int) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; ``shutdown()`` the server returned to stop."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/metrics":
                self.send_error(404)
                return
            body = render(summary()).encode()
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
