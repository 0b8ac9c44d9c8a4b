"""What ties an action's confirmation to its dry run: the request's fields (``Asked``), and
the preview token the dry run hands out and the confirmation must send back.

A preview token carries what the dry run showed, signed by a secret of this console
process (HMAC-SHA-256): the action, the operator it was shown to, what it was asked for
(the fields, a bulk action's keys), the count the confirmation names, and the state each
key (entity, row) was in (``idemctl.operate.repair.state_of``), or a purge's cutoff. On
the confirmation the action acts only on that: where the store has changed since, it says
what changed, from the token's states, and acts on nothing that changed.

Signed rather than kept: the console keeps nothing per preview (no memory that grows with
dry runs nobody confirms), a token survives any number of tabs, and the operator's own
browser sends back exactly what it was shown. Signed rather than plain form fields: a
client cannot confirm states it never previewed (a script must ask for the dry run
first), and one opaque field serves every action. The token is readable (base64 of
JSON), never secret: it holds only what the preview showed. A restarted console has
another secret, so its earlier previews are asked again.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import zlib
from collections.abc import Iterator, Mapping
from typing import Any

NOT_ASKED = ("csrf", "confirm", "preview")
"""Fields of a confirmation that say nothing of what it acts on."""
VERSION = 1


class Asked(Mapping[str, str]):
    """What an action was asked for: its single fields (``key``, ``entity``, ``older_than``,
    ``id``), and for a bulk action the keys picked (``selection``, ``key`` repeated)."""

    def __init__(self, fields: Mapping[str, str], selection: tuple[str, ...] = ()) -> None:
        self.fields = dict(fields)
        self.selection = selection

    def __getitem__(self, name: str) -> str:
        return self.fields[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.fields)

    def __len__(self) -> int:
        return len(self.fields)

    def __repr__(self) -> str:
        return f"Asked({self.fields!r}, {self.selection!r})"


def asked_of(values: Any, bulk: bool) -> Asked:
    """The fields of a query string or a form (Starlette's, with ``multi_items``): each
    field's last value, and, for a bulk action, every ``key`` in order, each once."""
    fields: dict[str, str] = {}
    picked: list[str] = []
    for name, value in values.multi_items():
        if name in NOT_ASKED:
            continue
        if bulk and name == "key":
            picked.append(str(value))
        else:
            fields[name] = str(value)
    return Asked(fields, tuple(dict.fromkeys(picked)))


class Signer:
    """Signs preview tokens and reads back those it signed (a secret of its own)."""

    def __init__(self, secret: bytes | None = None) -> None:
        self._secret = secret or secrets.token_bytes(32)

    def sign(self, payload: Mapping[str, Any]) -> str:
        body = zlib.compress(
            json.dumps({"v": VERSION, **payload}, separators=(",", ":"), sort_keys=True).encode()
        )
        return f"{_b64(body)}.{_b64(self._mac(body))}"

    def read(self, token: str | None) -> dict[str, Any] | None:
        """The payload of a token this signer signed; None for any other text."""
        if not token or token.count(".") != 1:
            return None
        body_text, mac_text = token.split(".")
        try:
            body, mac = _unb64(body_text), _unb64(mac_text)
        except ValueError:
            return None
        if not hmac.compare_digest(mac, self._mac(body)):
            return None
        try:
            payload = json.loads(zlib.decompress(body))
        except (ValueError, zlib.error):
            return None
        if not isinstance(payload, dict) or payload.get("v") != VERSION:
            return None
        return payload

    def _mac(self, body: bytes) -> bytes:
        return hmac.new(self._secret, body, hashlib.sha256).digest()


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    try:
        return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (ValueError, TypeError) as exc:
        raise ValueError(str(exc)) from None


SIGNER = Signer()
"""This console process's: a restart makes every earlier preview ask again."""
