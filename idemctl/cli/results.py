"""A record's stored result as ``inspect`` shows it: JSON, indented; a stored HTTP response
(``idemctl.http``) as the request it answered, its status, the headers it replays and its
body (as text when it is UTF-8 and short, else its size)."""

from __future__ import annotations

import base64
import binascii
import json

from rich.text import Text

from idemctl.model import JSON

BODY_SHOWN = 2000
"""Characters of a text body ``inspect`` shows; ``--json`` gives it all (in base64)."""


def result_text(result: JSON) -> Text:
    from idemctl.http.policy import is_stored_response

    if is_stored_response(result):
        assert isinstance(result, dict)
        return _response_text(result)
    return Text(json.dumps(result, ensure_ascii=False, indent=2))


def _response_text(result: dict[str, JSON]) -> Text:
    from idemctl.http.policy import status_line

    status = status_line(int(str(result["status"])))
    size = int(str(result.get("size", 0)))
    lines = [f"{result.get('method')} {result.get('path')} -> {status}, {size} bytes"]
    headers = result.get("headers")
    for pair in headers if isinstance(headers, list) else []:
        if isinstance(pair, list) and len(pair) == 2:
            lines.append(f"{pair[0]}: {pair[1]}")
    if result.get("too_large"):
        lines.append(f"(body: {size} bytes, too large to keep: a retry is told so, not run again)")
        return Text("\n".join(lines))
    try:
        body = base64.b64decode(str(result.get("body", "")), validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError):
        lines.append(f"(body: {size} bytes, not UTF-8 text; --json has it in base64)")
    else:
        if body:
            shown = body[:BODY_SHOWN]
            more = len(body) - len(shown)
            lines += ["", shown + (f"... ({more} more characters)" if more else "")]
    return Text("\n".join(lines))
