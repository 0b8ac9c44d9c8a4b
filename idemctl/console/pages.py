"""The console's page templates (``templates/``): Jinja2, every value escaped."""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

from idemctl.console.views import PAGE

PAGES = Environment(
    loader=PackageLoader("idemctl.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)


def with_cursor(params: Mapping[str, str], cursor: str) -> str:
    """The query string of ``params``' next page."""
    return urlencode({**{k: v for k, v in params.items() if k != "cursor"}, "cursor": cursor})


PAGES.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
"""JSON to read: escaped as any text when rendered (``tojson`` writes ``<`` as ``\\u003c``)."""
PAGES.globals.update(quote=lambda s: quote(str(s), safe=""), urlencode=urlencode,
                     with_cursor=with_cursor, page_size=PAGE)  # fmt: skip
