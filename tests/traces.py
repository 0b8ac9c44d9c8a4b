"""Running code under OpenTelemetry's SDK in a process of its own (a process sets its tracer
provider once) and reading back its spans from the SDK's in-memory exporter."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

SETUP = r"""
import json, sys
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)
"""

DUMP = r"""
print(json.dumps([{
    "name": s.name,
    "trace": format(s.context.trace_id, "032x"),
    "id": format(s.context.span_id, "016x"),
    "parent": format(s.parent.span_id, "016x") if s.parent else None,
    "kind": s.kind.name,
    "status": s.status.status_code.name,
    "attributes": dict(s.attributes),
} for s in exporter.get_finished_spans()]))
"""


def spans_of(body: str, *args: str, timeout: float = 120) -> list[dict[str, Any]]:
    """The finished spans of ``body`` (Python, its arguments in ``sys.argv[1:]``), run with
    the SDK set up: name, trace and span ids (hex), parent id, kind, status, attributes."""
    done = subprocess.run(
        [sys.executable, "-c", SETUP + body + DUMP, *args],
        capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    spans: list[dict[str, Any]] = json.loads(done.stdout.strip().splitlines()[-1])
    return spans
