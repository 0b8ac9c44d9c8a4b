"""Reading a command's ``--metrics-port`` the way Prometheus does: prometheus_client's own
parser over ``/metrics``; and its ``/healthz`` and ``/readyz`` answers."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]
"""Each sample's value by its name and its labels, sorted."""


def scrape(port: int, host: str = "127.0.0.1") -> tuple[Samples, dict[str, str]]:
    """The samples at /metrics, and each family's type, parsed by prometheus_client."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://{host}:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for s in family.samples:
            samples[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return samples, types


def probe(port: int, path: str, host: str = "127.0.0.1") -> tuple[int, str]:
    """The status and body of GET ``path`` (``/healthz``, ``/readyz``)."""
    try:
        with urllib.request.urlopen(f"http://{host}:{port}{path}", timeout=10) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def dashboard_metrics() -> set[str]:
    """The idemctl metric names the dashboard's queries use."""
    dashboard = json.loads((REPO / "examples" / "grafana-dashboard.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return {m for e in exprs for m in re.findall(r"idemctl_[a-z_]+", e)}
