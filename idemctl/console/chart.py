"""The overview's charts of the last hour: a small SVG bar chart a series (completed,
failed, stale), drawn on the server from the sampler's steps. No script and no style
attribute (the Content-Security-Policy allows neither inline): the bars are SVG shapes
with their sizes as attributes, each with a ``<title>`` the browser shows on hover."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from idemctl.console.display import Html, escaped

BARS = 60
"""Steps a chart shows, the newest at the right."""
BAR, GAP, HEIGHT = 4, 1, 40
WORDS = {"completed": "completed", "failed": "failed", "stale": "stale at the minute's end"}


def chart(steps: Sequence[Mapping[str, Any]], series: str, label: str | None = None) -> Html:
    """``series`` of ``steps`` (the sampler's document), the last ``BARS`` of them."""
    shown = list(steps)[-BARS:]
    values = [s.get(series) for s in shown]
    top = max([v for v in values if v is not None] or [0])
    width = BARS * (BAR + GAP)
    parts = [
        f'<svg class="chart {escaped(series)}" id="chart-{escaped(series)}" role="img" '
        f'width="{width}" height="{HEIGHT + 2}" viewBox="0 0 {width} {HEIGHT + 2}" '
        f'xmlns="http://www.w3.org/2000/svg"><title>{escaped(label or series)}</title>',
        f'<line class="axis" x1="0" y1="{HEIGHT + 1}" x2="{width}" y2="{HEIGHT + 1}"/>',
    ]
    offset = (BARS - len(shown)) * (BAR + GAP)
    for i, (step, value) in enumerate(zip(shown, values, strict=True)):
        x = offset + i * (BAR + GAP)
        when = datetime.fromtimestamp(float(step["at"]), UTC).strftime("%H:%M UTC")
        if value is None:
            parts.append(
                f'<rect class="gap" x="{x}" y="{HEIGHT - 2}" width="{BAR}" height="3">'
                f"<title>{when}: not known (the store did not say)</title></rect>"
            )
            continue
        height = 0 if top == 0 else max(1, round(HEIGHT * value / top)) if value else 0
        parts.append(
            f'<rect class="bar" x="{x}" y="{HEIGHT + 1 - height}" width="{BAR}" '
            f'height="{height}" data-value="{int(value)}"><title>{when}: {int(value)} '
            f"{escaped(WORDS.get(series, series))}</title></rect>"
        )
    parts.append("</svg>")
    return Html("".join(parts))


def summary(steps: Sequence[Mapping[str, Any]], series: str) -> dict[str, int | None]:
    """The series' total over the steps shown, its largest step and its last one."""
    values = [s.get(series) for s in list(steps)[-BARS:]]
    known = [v for v in values if v is not None]
    return {
        "total": sum(known) if known else None,
        "most": max(known) if known else None,
        "last": values[-1] if values else None,
    }
