"""The console's page templates (``templates/``): Jinja2, every value escaped."""

from __future__ import annotations

from urllib.parse import quote, urlencode

from jinja2 import Environment, PackageLoader, select_autoescape

PAGES = Environment(
    loader=PackageLoader("idemctl.console", "templates"),
    autoescape=select_autoescape(default=True, default_for_string=True),
)
PAGES.globals.update(quote=lambda s: quote(str(s), safe=""), urlencode=urlencode)
