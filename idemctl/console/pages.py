"""The console's page templates (``templates/``): Jinja2, every value escaped.

Filters beside Jinja2's own: ``shown`` writes a value with its invisible and bidirectional
characters escaped in a marked span (``display.shown``: use it wherever a key, an entity
or any text from the store is shown as text); ``attr`` writes a form field's value exactly
(hidden characters as character references), ``plain`` a title's text; ``ago``
writes a time as "3 min ago" with the absolute time in its title; ``since`` as "10 min".
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

from idemctl.console import display
from idemctl.console.chart import chart, summary
from idemctl.console.meaning import meaning
from idemctl.console.views import PAGE

PAGES = Environment(
    loader=PackageLoader("idemctl.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


def with_cursor(params: Mapping[str, str], cursor: str) -> str:
    """The query string of ``params``' next page."""
    return urlencode({**{k: v for k, v in params.items() if k != "cursor"}, "cursor": cursor})


def sorted_by(params: Mapping[str, str], name: str) -> str:
    """The query string of this page sorted by ``name``: descending when it is sorted by it
    ascending already."""
    now = params.get("sort", "")
    return urlencode({**{k: v for k, v in params.items() if k != "sort"},
                      "sort": f"-{name}" if now == name else name})  # fmt: skip


def sort_mark(params: Mapping[str, str], name: str) -> str:
    """``▲``/``▼`` beside the column the page is sorted by."""
    now = params.get("sort", "")
    return "▲" if now == name else "▼" if now == f"-{name}" else ""


PAGES.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
"""JSON to read: escaped as any text when rendered (``tojson`` writes ``<`` as ``\\u003c``)."""
PAGES.filters.update(shown=display.shown, plain=display.plain, attr=display.attr,
                     ago=display.ago, since=display.since)  # fmt: skip
PAGES.globals.update(quote=lambda s: quote(str(s), safe=""), urlencode=urlencode,
                     with_cursor=with_cursor, page_size=PAGE, meaning=meaning, chart=chart,
                     summary=summary, sorted_by=sorted_by, sort_mark=sort_mark)  # fmt: skip
