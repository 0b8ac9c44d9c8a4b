"""Optional packages: a missing one is an error that names the extra to install."""

from __future__ import annotations

import importlib.util

from idemctl.errors import MissingDriver


def require(package: str, extra: str, needed_by: str) -> None:
    """Raise MissingDriver, naming ``pip install 'idemctl[extra]'``, when ``package`` (an
    importable name such as ``confluent_kafka``) is not installed; import nothing."""
    if importlib.util.find_spec(package) is None:
        raise MissingDriver(f"{needed_by} needs {package}: pip install 'idemctl[{extra}]'")
