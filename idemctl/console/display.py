"""How the console writes values an operator must read exactly: a key with a character
that shows as nothing (a zero-width space, a byte order mark, a control) or that turns the
text around it (a right-to-left override) is shown with that character escaped, in a
marked span, so that two keys that differ only there never look alike; and times as
"3 min ago", the absolute time in the element's title.

Each function returns ``Html``: text already escaped for HTML, which Jinja2's autoescape
writes as it is (it has ``__html__``). Everything else they are given is escaped here.
"""

from __future__ import annotations

import html
import unicodedata
from datetime import UTC, datetime
from typing import Any

BIDI = frozenset(
    chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)
)
"""The bidirectional controls: embeddings and overrides (U+202A-202E), isolates
(U+2066-2069), the marks (U+200E, U+200F) and the Arabic letter mark (U+061C)."""
INVISIBLE = frozenset(
    chr(c)
    for c in (
        0x034F,  # combining grapheme joiner
        0x115F, 0x1160, 0x3164, 0xFFA0,  # Hangul fillers: letters that show as nothing
        0x2800,  # braille pattern blank
        *range(0x180B, 0x1810),  # Mongolian variation selectors and vowel separator
        *range(0xFE00, 0xFE10),  # variation selectors
        *range(0xE0100, 0xE01F0),  # variation selectors supplement
    )
)  # fmt: skip
"""Characters of other categories that show as nothing."""
HIDDEN_CATEGORIES = frozenset(("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp", "Zs"))
"""Controls, format characters (zero-width, BOM, tags), surrogates, private use and
unassigned code points, and separators (the plain space alone is left as it is)."""


class Html(str):
    """Text that is HTML already: autoescape leaves it as it is."""

    def __html__(self) -> str:
        return self


def escaped(value: Any) -> str:
    """``value`` as HTML text: escaped, unless it is HTML already."""
    if hasattr(value, "__html__"):
        return str(value.__html__())
    return html.escape(str(value), quote=True)


LAYOUT = frozenset(" \n\t")
"""The space, and the line break and tab that lay out a result's JSON: left as they are
(a key holds no control character; ``idemctl.model.validate_key``)."""


def hidden(char: str) -> bool:
    """Whether ``char`` shows as nothing, or changes how the text around it shows."""
    if char in LAYOUT:
        return False
    return char in BIDI or char in INVISIBLE or unicodedata.category(char) in HIDDEN_CATEGORIES


def code_of(char: str) -> str:
    """``\\u200b``, ``\\U000e0041``: the character as a Python string literal writes it."""
    point = ord(char)
    return f"\\u{point:04x}" if point <= 0xFFFF else f"\\U{point:08x}"


def shown(value: Any) -> Html:
    """``value`` as HTML text, each hidden character (``hidden``) written as its escape in
    ``<span class="esc">``, titled with its name. None is the empty text."""
    if value is None:
        return Html("")
    if hasattr(value, "__html__"):
        return Html(value.__html__())
    text = str(value)
    if not any(hidden(c) for c in text):
        return Html(html.escape(text, quote=True))
    parts = []
    for char in text:
        if hidden(char):
            name = unicodedata.name(char, "") or f"U+{ord(char):04X}"
            parts.append(f'<span class="esc" title="{html.escape(name)}">{code_of(char)}</span>')
        else:
            parts.append(html.escape(char, quote=True))
    return Html("".join(parts))


def attr(value: Any) -> Html:
    """``value`` for an attribute that must hold it exactly (a form field's ``value``):
    escaped, each hidden character written as a character reference (``&#x200b;``), which
    the browser reads back as the character itself."""
    if value is None:
        return Html("")
    text = html.escape(str(value), quote=True)
    return Html("".join(f"&#x{ord(c):x};" if hidden(c) else c for c in text))


def plain(value: Any) -> str:
    """``value`` as plain text with its hidden characters escaped (``\\u200b``): for a
    title attribute or any place a span cannot go (escape it as any text)."""
    if value is None:
        return ""
    return "".join(code_of(c) if hidden(c) else c for c in str(value))


def moment(value: Any) -> datetime | None:
    """An ISO 8601 time of a document (``...Z``) as an aware datetime; None for none."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        found = value
    else:
        try:
            found = datetime.fromisoformat(str(value).replace("Z", "+00:00"))
        except ValueError:
            return None
    return found if found.tzinfo else found.replace(tzinfo=UTC)


def span(seconds: float) -> str:
    """A duration to read at a glance: ``42 s``, ``10 min``, ``3 h 5 min``, ``2 d 4 h``."""
    s = int(abs(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min"
    if s < 86400:
        hours, minutes = divmod(s // 60, 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(s // 3600, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def absolute(at: datetime) -> str:
    """``2026-11-22 04:29:57 UTC``."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def ago(value: Any, now: datetime | None = None) -> Html:
    """``<time>`` saying how long ago (or how soon) ``value`` is: ``10 min ago``, ``in 5 s``,
    the absolute time in its ``title`` and ``datetime``. The empty text for none."""
    at = moment(value)
    if at is None:
        return Html("" if value is None else escaped(value))
    now = now or datetime.now(UTC)
    seconds = (now - at).total_seconds()
    words = "just now" if abs(seconds) < 1 else (
        f"{span(seconds)} ago" if seconds > 0 else f"in {span(seconds)}"
    )  # fmt: skip
    return Html(f'<time datetime="{_iso(at)}" title="{escaped(absolute(at))}">{words}</time>')


def _iso(at: datetime) -> str:
    return escaped(at.astimezone(UTC).isoformat().replace("+00:00", "Z"))


def since(value: Any, now: datetime | None = None) -> Html:
    """``<time>`` saying how long ``value`` has passed (``10 min``), for "stale for 10 min"."""
    at = moment(value)
    if at is None:
        return Html("")
    now = now or datetime.now(UTC)
    words = span((now - at).total_seconds())
    return Html(f'<time datetime="{_iso(at)}" title="{escaped(absolute(at))}">{words}</time>')


def clock(value: Any, now: datetime | None = None) -> Html:
    """``<time>`` saying when ``value`` was, on the clock: ``06:08:35 UTC`` (with the date
    when it is not today's), how long ago in its title."""
    at = moment(value)
    if at is None:
        return Html("")
    now = now or datetime.now(UTC)
    utc = at.astimezone(UTC)
    words = utc.strftime("%H:%M:%S UTC" if utc.date() == now.date() else "%Y-%m-%d %H:%M:%S UTC")
    seconds = (now - at).total_seconds()
    title = f"{absolute(at)}, {span(seconds)} {'ago' if seconds >= 0 else 'from now'}"
    return Html(f'<time datetime="{_iso(at)}" title="{escaped(title)}">{words}</time>')


def fill(template: str, *values: Any) -> Html:
    """``template`` (HTML, ``{}`` placeholders) with ``values`` escaped in: each shown, as
    a key would be, unless it is HTML already."""
    return Html(template.format(*(shown(v) for v in values)))
