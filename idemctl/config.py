"""``idemctl.yaml``: which store to use, by default and under named profiles.

    store: sqlite:///./idemctl.db
    profiles:
      prod:
        store: postgresql://app:${PGPASSWORD}@db.internal/payments

A ``${NAME}`` in a store URL is read from the environment when that URL is used, so a
password need not be written in the file. ``schemas/config.schema.json`` describes the
same shape; loading checks it here, without a JSON Schema library.

The store URL is chosen in this order: ``--store``; ``--profile``'s store (the profile's
``store``, else the file's); ``IDEMCTL_STORE``; the store of ``IDEMCTL_PROFILE``'s profile,
else the file's ``store``; ``sqlite:///./idemctl.db``. Flags beat the environment.
"""

from __future__ import annotations

import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from idemctl.errors import ConfigError

CONFIG_FILE = "idemctl.yaml"
"""Read from the working directory when no other file is named."""

_TOP_KEYS = ("store", "kafka", "profiles")
_PROFILE_KEYS = ("store", "kafka")
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


@dataclass(frozen=True)
class Profile:
    store: str | None = None
    kafka: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Config:
    path: Path | None = None
    """The file it was read from; None when there is none."""
    store: str | None = None
    profiles: dict[str, Profile] = field(default_factory=dict)
    kafka: dict[str, str] = field(default_factory=dict)
    """librdkafka settings for ``consume`` (a profile's win over these)."""

    def kafka_for(self, profile: str | None) -> dict[str, str]:
        """The librdkafka settings for ``profile``, variables expanded."""
        settings = dict(self.kafka)
        if profile is not None and profile in self.profiles:
            settings.update(self.profiles[profile].kafka)
        where = str(self.path or CONFIG_FILE)
        return {k: _expand(v, f"{where}: kafka.{k}") for k, v in settings.items()}

    def store_for(self, profile: str | None, given_by: str | None = None) -> tuple[str | None, str]:
        """The store URL this file gives for ``profile`` (variables expanded), and where
        it comes from; None when the file names none. ``given_by`` says who chose the
        profile (``--profile prod``, ``IDEMCTL_PROFILE=prod``) for that description."""
        where = str(self.path or CONFIG_FILE)
        raw, source = self.store, f"{where}: store"
        if profile is not None:
            if profile not in self.profiles:
                known = ", ".join(sorted(self.profiles)) or "none defined"
                raise ConfigError(
                    f"no profile {profile!r} in {where} (profiles: {known}); "
                    "add it under 'profiles:' or pick another with --profile"
                )
            own = self.profiles[profile].store
            if own is not None:
                source = f"{where}: profiles.{profile}.store"
                url = _expand(own, source)
                return url, source if given_by is None else f"{given_by} in {where}"
        return (None if raw is None else _expand(raw, source)), source


def find_config(explicit: str | Path | None = None, cwd: Path | None = None) -> Path | None:
    """The config file to read: ``explicit`` (which must exist), else ``./idemctl.yaml``
    if there is one, else None."""
    if explicit is not None and str(explicit) != "":
        path = Path(explicit).expanduser()
        if not path.is_file():
            raise ConfigError(
                f"config file {str(path)!r} not found (named by --config or IDEMCTL_CONFIG)"
            )
        return path
    default = (cwd or Path.cwd()) / CONFIG_FILE
    return default if default.is_file() else None


def load_config(path: Path | None) -> Config:
    """Read and check the file at ``path``; an empty Config when ``path`` is None."""
    if path is None:
        return Config()
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {str(path)!r}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config file {str(path)!r} is not UTF-8 text") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or "not valid YAML"
        raise ConfigError(f"{path}{where}: {problem}; fix the YAML syntax") from None
    if data is None:
        return Config(path)
    _check_mapping(data, str(path), _TOP_KEYS)
    store = _check_store(data, str(path))
    kafka = _check_kafka(data, str(path))
    profiles_raw = data.get("profiles") or {}
    if not isinstance(profiles_raw, dict):
        raise ConfigError(f"{path}: 'profiles' must map profile names to settings")
    profiles = {}
    for name, body in profiles_raw.items():
        where = f"{path}: profiles.{name}"
        settings = {} if body is None else body
        _check_mapping(settings, where, _PROFILE_KEYS)
        profiles[str(name)] = Profile(
            store=_check_store(settings, where), kafka=_check_kafka(settings, where)
        )
    return Config(path, store, profiles, kafka)


def _check_mapping(data: Any, where: str, allowed: tuple[str, ...]) -> None:
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: expected a mapping of settings ({', '.join(allowed)})")
    for key in data:
        if key not in allowed:
            close = difflib.get_close_matches(str(key), allowed, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"allowed: {', '.join(allowed)}"
            raise ConfigError(f"{where}: unknown setting {key!r}; {hint}")


def _check_store(data: dict[str, Any], where: str) -> str | None:
    store = data.get("store")
    if store is None or (isinstance(store, str) and "://" in store):
        return store
    found = "a string without scheme://" if isinstance(store, str) else type(store).__name__
    raise ConfigError(
        f"{where}: 'store' must be a store URL such as sqlite:///./idemctl.db or "
        f"redis://host:6379/0, not {found}"
    )


def _check_kafka(data: dict[str, Any], where: str) -> dict[str, str]:
    kafka = data.get("kafka") or {}
    if not isinstance(kafka, dict) or not all(
        isinstance(v, str | int | float | bool) for v in kafka.values()
    ):
        raise ConfigError(
            f"{where}: 'kafka' must map librdkafka settings to values, e.g. "
            "bootstrap.servers: kafka:9092"
        )
    return {str(k): str(v).lower() if isinstance(v, bool) else str(v) for k, v in kafka.items()}


def _expand(url: str, source: str) -> str:
    def value(match: re.Match[str]) -> str:
        name = match.group(1)
        if name not in os.environ:
            raise ConfigError(f"{source} uses ${{{name}}}, which is not set in the environment")
        return os.environ[name]

    return _VARIABLE.sub(value, url)
