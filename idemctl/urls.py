"""Store URLs: parsing their options and printing them without passwords."""

from __future__ import annotations

import re
from urllib.parse import SplitResult, parse_qsl, unquote, urlsplit

from idemctl.durations import MAX_DURATION, check_duration, parse_duration
from idemctl.errors import ConfigError

# "scheme://user:secret@host": the secret runs to the last "@", as urlsplit reads it, so a
# "#", "/" or "?" in it is hidden too, where urlsplit would stop early. Also matched in text
# that is no URL ("user:secret@host"). A URL with an "@" in its query may lose more than its
# password: printing too little is the safe side.
_CREDENTIALS = re.compile(
    r"^(?P<head>[A-Za-z][A-Za-z0-9+.-]*:/+[^:@/]*|(?![A-Za-z][A-Za-z0-9+.-]*:/)[^:@/]*)"
    r":(?P<secret>.*)@"
)
# libpq-style query options that carry secrets.
_SECRET_OPTION = re.compile(
    r"(?i)\b(password|passwd|pwd|secret|token|sslpassword|aws_secret_access_key|aws_session_token)=[^&#\s]*"
)


def redact_url(url: str) -> str:
    """The URL with any password replaced by ``***``: the only form that may be printed."""
    url = _CREDENTIALS.sub(lambda m: f"{m['head']}:***@", url, count=1)
    return _SECRET_OPTION.sub(lambda m: f"{m.group(1)}=***", url)


def split_url(url: str) -> SplitResult:
    """``urlsplit`` with a ConfigError (that hides the password) for what it cannot parse."""
    if "://" not in url:
        raise ConfigError(
            f"not a store URL: {redact_url(url)!r} (expected scheme://..., "
            "e.g. sqlite:///./idemctl.db or memory://)"
        )
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - parses the port, raising for a bad one
    except ValueError as exc:
        raise ConfigError(f"cannot parse store URL {redact_url(url)}: {exc}") from None
    return parts


class UrlOptions:
    """The query options of a store URL, consumed one by one so unknown ones are reported."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.parts = split_url(url)
        self._options = dict(parse_qsl(self.parts.query, keep_blank_values=True))

    def text(self, name: str, default: str | None = None) -> str | None:
        return self._options.pop(name, default)

    def duration(
        self, name: str, default: float, least: float = 0.0, most: float = MAX_DURATION
    ) -> float:
        """A duration from ``least`` to ``most`` seconds; absent is ``default``."""
        raw = self._options.pop(name, None)
        if raw is None:
            return default
        try:
            seconds = parse_duration(raw)
        except ValueError as exc:
            raise ConfigError(f"store URL option {name}: {exc}") from None
        try:
            return check_duration(f"store URL option {name}", seconds, least, most)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None

    def whole(self, name: str, default: int, minimum: int = 0) -> int:
        """A whole number of at least ``minimum``; blank or absent is ``default``."""
        raw = self._options.pop(name, None) or str(default)
        if not raw.isdigit() or int(raw) < minimum:
            least = f", at least {minimum}" if minimum else ""
            raise ConfigError(f"store URL option {name}={raw!r}: use a whole number{least}")
        return int(raw)

    def flag(self, name: str, default: bool) -> bool:
        raw = self._options.pop(name, None)
        if raw is None:
            return default
        if raw.lower() in {"1", "true", "yes", "on"}:
            return True
        if raw.lower() in {"0", "false", "no", "off"}:
            return False
        raise ConfigError(f"store URL option {name}={raw!r}: use 1 or 0")

    def choice(self, name: str, choices: tuple[str, ...], default: str) -> str:
        raw = self._options.pop(name, None)
        if raw is None:
            return default
        if raw.lower() not in choices:
            raise ConfigError(f"store URL option {name}={raw!r}: use one of {', '.join(choices)}")
        return raw.lower()

    def finish(self) -> None:
        """Raise for options nobody consumed: a typo must not be silently ignored."""
        if self._options:
            names = ", ".join(sorted(self._options))
            raise ConfigError(f"unknown store URL option(s) {names} in {redact_url(self.url)}")


def secrets_in(url: str) -> list[str]:
    """The secrets a store URL carries (its password, secret options), as written and as
    decoded, longest first: what ``redact_text`` must hide wherever it shows up."""
    found: set[str] = set()
    credentials = _CREDENTIALS.match(url)
    if credentials and credentials["secret"]:
        found |= {credentials["secret"], unquote(credentials["secret"])}
    for match in _SECRET_OPTION.finditer(url):
        value = match.group(0).split("=", 1)[1]
        if value:
            found |= {value, unquote(value)}
    return sorted(found, key=len, reverse=True)


def redact_text(text: str, secrets: list[str]) -> str:
    """``text`` with each of ``secrets`` replaced by ``***``."""
    for secret in secrets:
        text = text.replace(secret, "***")
    return text
