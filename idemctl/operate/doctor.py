"""``doctor``'s policy as a library call: check a store and say how to fix what is wrong.

    from idemctl.doctor import diagnose

    report = diagnose("postgresql://app@db/orders", source="the deploy script")
    for finding in report.failed:
        print(finding.name, finding.detail, finding.fix)

No printing here: ``idemctl doctor`` renders the report and maps its verdict to an exit code.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from enum import StrEnum

from idemctl import backends
from idemctl.errors import ConfigError, NotProvisioned, StoreUnavailable
from idemctl.exitcodes import ExitCode
from idemctl.model import Finding
from idemctl.operate.targets import Target, open_target
from idemctl.urls import redact_url

NOT_PROVISIONED = frozenset({"schema", "table", "scripts"})
"""Findings that fail when the store was never provisioned (``idemctl init`` fixes them)."""

UNREACHABLE_FIX = "is the server running, and are the URL's host, port and credentials right?"


class Diagnosis(StrEnum):
    """What the findings add up to; the first that holds, in this order, wins."""

    OK = "ok"
    """Nothing failed (warnings may remain)."""
    REFUSED = "refused"
    """The server refused the credentials or the database."""
    UNREACHABLE = "unreachable"
    NOT_PROVISIONED = "not_provisioned"
    PROBLEM = "problem"
    """Any other failed finding."""


@dataclass(frozen=True)
class DoctorReport:
    url: str
    """The store's URL, redacted."""
    source: str
    """Where the URL came from, as the caller named it."""
    findings: list[Finding]
    """The first is always ``store``: the URL and its source."""

    @property
    def failed(self) -> list[Finding]:
        return [f for f in self.findings if not f.ok]

    @property
    def warned(self) -> list[Finding]:
        return [f for f in self.findings if f.level == "warn"]

    @property
    def diagnosis(self) -> Diagnosis:
        failed = {f.name for f in self.failed}
        if "credentials" in failed:
            return Diagnosis.REFUSED
        if "connection" in failed:
            return Diagnosis.UNREACHABLE
        if failed & NOT_PROVISIONED:
            return Diagnosis.NOT_PROVISIONED
        return Diagnosis.PROBLEM if failed else Diagnosis.OK

    @property
    def ok(self) -> bool:
        return self.diagnosis is Diagnosis.OK

    @property
    def exit_code(self) -> ExitCode:
        """``idemctl doctor``'s exit code for this report."""
        return EXIT[self.diagnosis]


EXIT = {
    Diagnosis.OK: ExitCode.OK,
    Diagnosis.REFUSED: ExitCode.USAGE,
    Diagnosis.UNREACHABLE: ExitCode.STORE_UNREACHABLE,
    Diagnosis.NOT_PROVISIONED: ExitCode.NOT_PROVISIONED,
    Diagnosis.PROBLEM: ExitCode.UNEXPECTED,
}


def diagnose(
    url: str,
    source: str,
    *,
    opener: Callable[[], AbstractContextManager[Target]] | None = None,
) -> DoctorReport:
    """Open the store at ``url`` and run its checks (and, on PostgreSQL, the outbox's),
    turning what stops them (unreachable, credentials refused, not provisioned) into
    findings with their fixes.

    ``opener`` opens the store instead of ``open_target(url)``, as a context manager that
    closes it (the CLI's also names the store on stderr). A Powertools table's URL
    (``layout=powertools``) opens its table, with checks of its own and no outbox. A URL
    that cannot name a store at all (an unknown scheme, a missing driver) raises
    ConfigError, as ``open_store`` does.
    """
    shown = redact_url(url)
    findings = [Finding("store", True, f"{shown} (from {source})")]
    try:
        with (opener or (lambda: open_target(url)))() as target:  # a cluster connects here
            try:
                findings += target.check()
            except NotProvisioned as exc:
                findings.append(Finding("schema", False, str(exc), target.unprovisioned_fix))
            except ConfigError as exc:  # refused credentials, no such database
                fix = backends.for_url(url).credentials_fix
                findings.append(Finding("credentials", False, str(exc), fix))
    except StoreUnavailable as exc:
        findings.append(Finding("connection", False, str(exc), UNREACHABLE_FIX))
    return DoctorReport(shown, source, findings)
