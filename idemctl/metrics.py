"""``--metrics-port``: a long-running command's metrics for Prometheus at ``/metrics``, in
prometheus_client's exposition, liveness at ``/healthz`` and readiness at ``/readyz``, all
served from a daemon thread. prometheus_client is imported when a port is given, never by
``import idemctl``.

Each command registers its own collectors in a registry of the run's own (``Register``) and
says what makes it ready."""

from __future__ import annotations

import itertools
import platform
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

    from idemctl.stores.base import Store

Ready = Callable[[], str | None]
"""Why the command is not ready to do its work now; None when it is."""
Register = Callable[["CollectorRegistry"], Ready]
"""Registers a command's collectors in the run's registry; returns its readiness."""

PROBE_KEY = "idemctl-readyz-probe"
"""The key ``/readyz`` reads to see that the store answers (it need not exist)."""
SECONDS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Histogram buckets for handler and store-call durations: sub-millisecond to 10 s."""


def build_info(registry: CollectorRegistry, store: Store) -> None:
    """``idemctl_build_info``: idemctl's version, Python's and the store's kind."""
    from prometheus_client import Info

    from idemctl import __version__

    Info("idemctl_build", "idemctl's version, Python's and the store's.", registry=registry).info(
        {
            "version": __version__,
            "python": platform.python_version(),
            "store": store.url.partition(":")[0],
        }
    )


class Scraped:
    """A collector whose metric families are made from a run's state at each scrape."""

    def __init__(self, families: Callable[[], Iterable[Any]]) -> None:
        self._families = families

    def collect(self) -> Iterable[Any]:
        return self._families()


def counter(name: str, text: str, value: float | Mapping[str, float], label: str = "") -> Any:
    """A counter family (``name``_total): one value, or one a value of ``label``."""
    from prometheus_client.core import CounterMetricFamily

    if not isinstance(value, Mapping):
        return CounterMetricFamily(name, text, value=value)
    family = CounterMetricFamily(name, text, labels=[label])
    for labelled, n in value.items():
        family.add_metric([labelled], n)
    return family


def gauge(name: str, text: str, value: float) -> Any:
    from prometheus_client.core import GaugeMetricFamily

    return GaugeMetricFamily(name, text, value=value)


def histogram(
    name: str, text: str, bounds: Sequence[float], buckets: Sequence[int], total: float
) -> Any:
    """A histogram family from per-bucket counts (``bounds`` and then +Inf) and their sum."""
    from prometheus_client.core import HistogramMetricFamily

    cumulative = list(zip([*map(str, bounds), "+Inf"], itertools.accumulate(buckets), strict=True))
    return HistogramMetricFamily(name, text, buckets=cumulative, sum_value=total)


def wait_families() -> list[Any]:
    """``wait=``'s figures in this process, every store's (``idemctl.stores.waiting.STATS``):
    waits begun, how they ended (woken: the key settled by another, its result or the key
    to run; timed_out: still in flight at the deadline), and how long they took."""
    from idemctl.stores.waiting import SECONDS as WAIT_SECONDS
    from idemctl.stores.waiting import STATS

    begun, woken, timed_out, buckets, total = STATS.snapshot()
    return [
        counter("idemctl_waits_begun", "Calls that found their key in flight and waited.", begun),
        counter(
            "idemctl_waits_ended",
            "Waits ended: woken (the key settled by another) or timed_out (still in flight).",
            {"woken": woken, "timed_out": timed_out},
            "how",
        ),
        histogram(
            "idemctl_wait_seconds",
            "Seconds a call waited for a key in flight.",
            WAIT_SECONDS,
            buckets,
            total,
        ),
    ]


def register_waits(registry: CollectorRegistry) -> None:
    """``wait_families`` in an application's registry, read at each scrape:
    ``idemctl.metrics.register_waits(prometheus_client.REGISTRY)``."""
    registry.register(Scraped(wait_families))


def http_families() -> list[Any]:
    """The HTTP middleware's figures in this process (``idemctl.http.stats.STATS``):
    requests by outcome, and the seconds the middleware added to each (the store's round
    trips, reading and buffering; not the app's own time)."""
    from idemctl.http.stats import SECONDS as HTTP_SECONDS
    from idemctl.http.stats import STATS

    counts, buckets, total = STATS.snapshot()
    return [
        counter(
            "idemctl_http_requests",
            "Requests with an Idempotency-Key (or missing one), by outcome.",
            counts,
            "outcome",
        ),
        histogram(
            "idemctl_http_added_seconds",
            "Seconds the idempotency middleware added to a request, not counting the app's.",
            HTTP_SECONDS,
            buckets,
            total,
        ),
    ]


def register_http(registry: CollectorRegistry) -> None:
    """``http_families`` in an application's registry, read at each scrape:
    ``idemctl.metrics.register_http(prometheus_client.REGISTRY)``."""
    registry.register(Scraped(http_families))


def task_families() -> list[Any]:
    """The background-task doors' figures in this process (``idemctl.tasks.stats.STATS``),
    by queue and task: guarded calls by outcome (new, replayed, error, busy, mismatch,
    failed, lease_lost), and the seconds they took (the task's run and the store's round
    trips, a count and a sum a call)."""
    from prometheus_client.core import CounterMetricFamily, SummaryMetricFamily

    from idemctl.tasks.stats import STATS

    runs, seconds = STATS.snapshot()
    calls = CounterMetricFamily(
        "idemctl_task_calls",
        "Guarded background-task calls, by queue, task and outcome.",
        labels=["queue", "task", "outcome"],
    )
    for labels, n in sorted(runs.items()):
        calls.add_metric(list(labels), n)
    counted: dict[tuple[str, str], int] = {}
    for (queue, task, _), n in runs.items():
        counted[queue, task] = counted.get((queue, task), 0) + n
    took = SummaryMetricFamily(
        "idemctl_task_seconds",
        "Seconds a guarded background-task call took (its run and the store's round trips).",
        labels=["queue", "task"],
    )
    for (queue, task), total in sorted(seconds.items()):
        took.add_metric([queue, task], count_value=counted[queue, task], sum_value=total)
    return [calls, took]


def register_tasks(registry: CollectorRegistry) -> None:
    """``task_families`` in a worker's registry, read at each scrape:
    ``idemctl.metrics.register_tasks(prometheus_client.REGISTRY)``."""
    registry.register(Scraped(task_families))


def merged(texts: Iterable[str], ended: Iterable[str] = ()) -> list[Any]:
    """The metric families of several processes' expositions as one: samples with the same
    name and labels summed (counters, histograms, and gauges of partitions, leases and lag,
    which add up across processes), ``idemctl_build_info`` once, ``_created`` times left
    out. ``ended``: the last expositions of processes that ended, whose counters and
    histograms still count (so a sum never goes down when a process is replaced) and whose
    gauges and info do not (as prometheus_client's multiprocess mode keeps dead processes'
    counters)."""
    from prometheus_client.core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    families: dict[str, Any] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    sources = [(text, True) for text in texts] + [(text, False) for text in ended]
    for text, alive in sources:
        for family in text_string_to_metric_families(text):
            if not alive and family.type not in ("counter", "histogram", "summary"):
                continue
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            into = values[family.name]
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue  # a time, not a count: summing means nothing
                key = (sample.name, tuple(sorted(sample.labels.items())))
                if family.type == "info" or sample.name.endswith("_info"):
                    into[key] = sample.value  # a label set, its value 1: once, not summed
                else:
                    into[key] = into.get(key, 0.0) + sample.value
    for name, family in families.items():
        for (sample_name, labels), value in values[name].items():
            family.add_sample(sample_name, dict(labels), value)
    return list(families.values())


def store_answers(store: Store) -> str | None:
    """None when the store answers a read now, else why not (for ``/readyz``)."""
    from idemctl.errors import IdemctlError

    try:
        store.get(PROBE_KEY)
    except IdemctlError as exc:
        return f"store unreachable: {exc}"
    return None


def serve(registry: CollectorRegistry, ready: Ready, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``registry`` at /metrics, 200 at /healthz, and at /readyz 200 or 503 with the
    reason ``ready()`` gives; ``shutdown()`` the server returned to stop."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path = self.path.split("?")[0]
            if path == "/metrics":
                self._send(200, generate_latest(registry), CONTENT_TYPE_LATEST)
            elif path == "/healthz":  # the process serves: alive
                self._send(200, b"ok\n")
            elif path == "/readyz":
                try:
                    why = ready()
                except Exception as exc:  # a probe that fails is an answer: not ready
                    why = f"{type(exc).__name__}: {exc}"
                self._send(503 if why else 200, f"{why or 'ready'}\n".encode())
            else:
                self.send_error(404)

        def _send(self, code: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
            self.send_response(code)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes and probes are not news

    try:
        server = ThreadingHTTPServer((host, port), Handler)
    except OSError as exc:  # taken, or an address this machine does not have
        from idemctl.errors import ConfigError

        raise ConfigError(f"metrics: cannot listen on {host}:{port}: {exc.strerror}") from None
    threading.Thread(target=server.serve_forever, name="idemctl-metrics", daemon=True).start()
    return server


@contextmanager
def serving(register: Register, host: str, port: int | None) -> Iterator[None]:
    """``serve`` for the block, with what ``register`` puts in a registry of its own, when a
    port is given; nothing otherwise."""
    if port is None:
        yield
        return
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    server = serve(registry, register(registry), host, port)
    try:
        yield
    finally:
        server.shutdown()
        server.server_close()
