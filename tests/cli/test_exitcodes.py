"""One exit code per kind of failure, shown in ``idemctl --help``; the CLI honours them."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import idemctl
from idemctl.cli.exitcodes import MEANINGS, ExitCode, exit_code_for, exit_code_table
from idemctl.consume import ConsumeAborted
from idemctl.errors import (
    ConfigError,
    ConsumeStopped,
    FingerprintMismatch,
    IdemctlError,
    InvalidKey,
    InvalidPayload,
    KafkaUnavailable,
    KeyNotFound,
    LeaseLost,
    MissingDriver,
    NotProvisioned,
    Refused,
    StoreError,
    StoreUnavailable,
    StuckHandlers,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("exc", "code"),
    [
        (ConfigError("bad url"), 2),
        (MissingDriver("pip install 'idemctl[redis]'"), 2),
        (InvalidKey("empty"), 2),
        (InvalidPayload("nan"), 2),
        (StoreUnavailable("down"), 3),
        (NotProvisioned("run idemctl init"), 4),
        (KeyNotFound("order:1"), 5),
        (Refused("live lease"), 6),
        (KafkaUnavailable("no partitions within 60s"), 7),
        (ConsumeStopped("20 messages in a row were dead-lettered"), 8),
        (ConsumeAborted("--on-missing-key stop"), 8),
        (StuckHandlers("--drain-timeout 30s passed", ("k",)), 9),
        (KeyboardInterrupt(), 130),
        (LeaseLost("taken over"), 1),
        (StoreError("odd"), 1),
        (FingerprintMismatch("other args"), 1),
        (IdemctlError("odd"), 1),
        (Exception("boom"), 1),
        (RuntimeError("boom"), 1),
    ],
)
def test_exit_code_for(exc: BaseException, code: int) -> None:
    assert exit_code_for(exc) == code
    assert isinstance(exit_code_for(exc), ExitCode)


def test_exit_codes_match_the_documented_table() -> None:
    assert {c.name: int(c) for c in ExitCode} == {
        "OK": 0,
        "UNEXPECTED": 1,
        "USAGE": 2,
        "STORE_UNREACHABLE": 3,
        "NOT_PROVISIONED": 4,
        "KEY_NOT_FOUND": 5,
        "REFUSED": 6,
        "KAFKA_UNREACHABLE": 7,
        "CONSUME_STOPPED": 8,
        "HANDLERS_STUCK": 9,
        "INTERRUPTED": 130,
    }


def test_every_exit_code_appears_in_the_table_with_its_meaning() -> None:
    table = exit_code_table()
    lines = table.splitlines()
    assert len(lines) == len(ExitCode)
    for code in ExitCode:
        assert any(
            re.fullmatch(rf"\s*{int(code)}\s+{re.escape(MEANINGS[code])}", line) for line in lines
        ), code


def test_every_exit_code_has_a_meaning() -> None:
    assert set(MEANINGS) == set(ExitCode)
    assert all(MEANINGS[c].strip() for c in ExitCode)


# The command itself ------------------------------------------------------------------------


def idemctl_cli(*args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1", "TERM": "dumb"}
    return subprocess.run(
        [sys.executable, "-m", "idemctl", *args],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )


def squash(text: str) -> str:
    return " ".join(text.split())


def test_help_exits_0_and_shows_the_exit_code_table() -> None:
    done = idemctl_cli("--help")
    assert done.returncode == 0, done.stderr
    shown = squash(done.stdout)
    assert "Exit codes" in shown
    for line in exit_code_table().splitlines():
        assert squash(line) in shown


def test_version_prints_the_version() -> None:
    done = idemctl_cli("version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == idemctl.__version__


def test_unknown_command_exits_2() -> None:
    done = idemctl_cli("nosuch")
    assert done.returncode == 2
    assert "nosuch" in done.stderr
