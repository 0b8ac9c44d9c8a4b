"""What the claim benchmarks share: payloads, throwaway servers' plumbing, timed runs and
best-of-N rates, ratios and their table. Each benchmark keeps what is particular to its
store: starting the server, the contenders, counting round trips, the main table.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import itertools
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

RET_OK = 0
RET_FAILED = 1
RET_NO_SERVER = 2
RET_MISSING = 3
RET_INTERRUPTED = 130

HOST = "127.0.0.1"
CENSUS_MESSAGES = 200
"""Messages per contender in the untimed pass that counts round trips and server work."""


class BenchError(Exception):
    """A contender misbehaved or could not be set up: reported, never a traceback."""


class MissingPart(BenchError):
    """Something the benchmark needs is not installed or not written yet."""


class NoServer(MissingPart):
    """No server binary to start, and no URL of one given."""


def finish(
    name: str,
    work: Callable[[], dict[str, Any]],
    report: Callable[[dict[str, Any]], None],
    as_json: bool,
    driver: str | None = None,
    server: str = "the server",
) -> int:
    """Run a benchmark's ``work``, print its ``report`` (and its data with ``as_json``),
    and return the exit status: what went wrong is one line on stderr, never a traceback
    (an error of the ``driver`` module, psycopg say, is what ``server`` answered)."""
    try:
        data = work()
    except NoServer as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return RET_NO_SERVER
    except MissingPart as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return RET_MISSING
    except BenchError as exc:
        print(f"{name}: {exc}", file=sys.stderr)
        return RET_FAILED
    except Exception as exc:
        if driver is None or not type(exc).__module__.startswith(driver):
            raise
        print(f"{name}: {server} said: {exc}", file=sys.stderr)
        return RET_FAILED
    except KeyboardInterrupt:
        print(f"{name}: interrupted", file=sys.stderr)
        return RET_INTERRUPTED
    report(data)
    if as_json:
        print(json.dumps(data, indent=2))
    return RET_OK


# Payloads ------------------------------------------------------------------------------


def payload(i: int) -> dict[str, int]:
    return {"order": i, "amount": 100}


def result_for(i: int) -> dict[str, Any]:
    return {"charged": True, "order": i}


# Throwaway servers -----------------------------------------------------------------------


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


def die_with_parent(signum: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``signum`` if this process dies without stopping it."""

    def preexec() -> None:
        with contextlib.suppress(Exception):
            ctypes.CDLL(None, use_errno=True).prctl(1, signum)  # PR_SET_PDEATHSIG

    return preexec


def stop_process(
    proc: subprocess.Popen[bytes], first: int = signal.SIGTERM, timeout: float = 10
) -> None:
    """Stop the server by its PID only: ``first``, then SIGKILL if it lingers."""
    if proc.poll() is not None:
        return
    proc.send_signal(first)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _terminate(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop the server


def stop_on_sigterm() -> None:
    signal.signal(signal.SIGTERM, _terminate)


# Contenders and their runs -----------------------------------------------------------------


@dataclass
class Phase:
    """One measured path of one contender. ``step`` processes some messages and says how
    many; ``prepare`` runs before each timed run; ``check`` verifies a run afterwards."""

    name: str
    contender: str
    path: str
    step: Callable[[], int]
    prepare: Callable[[], None] = lambda: None
    check: Callable[[], None] = lambda: None
    census_messages: int = CENSUS_MESSAGES
    rates: list[float] = field(default_factory=list)
    messages: int = 0
    client_cpu: float = 0.0
    server_cpu: float = 0.0
    round_trips: float | None = None
    commands: dict[str, float] = field(default_factory=dict)
    """What the server ran per message, by command (Redis) or statement kind (PostgreSQL)."""
    transactions: float | None = None
    rows_written: float | None = None
    connections: int | None = None

    @property
    def best(self) -> float:
        return max(self.rates) if self.rates else 0.0


class KeyLog:
    """The message numbers a unique run completed, replayed in order by a duplicate run."""

    def __init__(self) -> None:
        self.done: list[int] = []
        self._replay: Iterator[int] = iter(())

    def rewind(self) -> None:
        if not self.done:
            raise BenchError("no completed keys to replay as duplicates")
        self._replay = itertools.cycle(list(self.done))

    def next_done(self) -> int:
        return next(self._replay)


class IdemctlSingle:
    """One message at a time: claim, then complete with the owner and fencing token."""

    def __init__(self, store: Any) -> None:
        self.store = store
        self.numbers = itertools.count()
        self.log = KeyLog()

    def unique(self) -> int:
        from idemctl import Acquired, fingerprint

        i = next(self.numbers)
        key = f"single-{i}"
        outcome = self.store.claim(key, fingerprint(payload(i)))
        if not isinstance(outcome, Acquired):
            raise BenchError(f"idemctl: claim of new key {key} gave {type(outcome).__name__}")
        self.store.complete(key, outcome.owner, outcome.fencing_token, result_for(i))
        self.log.done.append(i)
        return 1

    def duplicate(self) -> int:
        from idemctl import Completed, fingerprint

        i = self.log.next_done()
        outcome = self.store.claim(f"single-{i}", fingerprint(payload(i)))
        if not isinstance(outcome, Completed):
            raise BenchError(f"idemctl: duplicate single-{i} gave {type(outcome).__name__}")
        return 1

    def phases(self) -> list[Phase]:
        label = "idemctl single"
        return [
            Phase("idemctl_single", label, "unique", self.unique),
            Phase("idemctl_single_dup", label, "duplicate", self.duplicate, self.log.rewind),
        ]

    def close(self) -> None:
        self.store.close()


class IdemctlBatched:
    """Batches of ``batch`` messages: claim_many, then complete_many of what was acquired."""

    def __init__(self, store: Any, batch: int) -> None:
        self.store = store
        self.batch = batch
        self.numbers = itertools.count()
        self.log = KeyLog()  # holds the first number of each completed batch

    def _requests(self, first: int) -> list[Any]:
        from idemctl import ClaimRequest, fingerprint

        return [
            ClaimRequest(f"batch-{i}", fingerprint(payload(i)))
            for i in range(first, first + self.batch)
        ]

    def unique(self) -> int:
        from idemctl import Acquired, Completion

        first = next(self.numbers) * self.batch
        outcomes = self.store.claim_many(self._requests(first))
        completions = []
        for i, outcome in enumerate(outcomes, start=first):
            if not isinstance(outcome, Acquired):
                raise BenchError(f"idemctl: claim_many of new batch-{i} gave {outcome!r}")
            completions.append(
                Completion(outcome.key, outcome.owner, outcome.fencing_token, result_for(i))
            )
        if len(completions) != self.batch or not all(self.store.complete_many(completions)):
            raise BenchError("idemctl: complete_many did not complete the whole batch")
        self.log.done.append(first)
        return self.batch

    def duplicate(self) -> int:
        from idemctl import Completed

        first = self.log.next_done()
        outcomes = self.store.claim_many(self._requests(first))
        if len(outcomes) != self.batch or not all(isinstance(o, Completed) for o in outcomes):
            raise BenchError(f"idemctl: a duplicate batch from batch-{first} was not Completed")
        return self.batch

    def phases(self) -> list[Phase]:
        label = f"idemctl batched x{self.batch}"
        census = max(CENSUS_MESSAGES, 2 * self.batch)
        return [
            Phase("idemctl_batched", label, "unique", self.unique, census_messages=census),
            Phase(
                "idemctl_batched_dup",
                label,
                "duplicate",
                self.duplicate,
                self.log.rewind,
                census_messages=census,
            ),
        ]

    def close(self) -> None:
        self.store.close()


def run_for(phase: Phase, seconds: float) -> tuple[int, float]:
    """Messages ``phase.step`` processed in about ``seconds``, and the seconds it took."""
    phase.prepare()
    step = phase.step
    messages = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        messages += step()
        now = time.perf_counter()
        if now >= deadline:
            break
    phase.check()
    return messages, now - start


def measure(phase: Phase, seconds: float, server_cpu: Callable[[], float]) -> float:
    """One timed run of ``phase``: records its rate and the CPU both sides spent on it."""
    server_before, client_before = server_cpu(), time.process_time()
    messages, elapsed = run_for(phase, seconds)
    phase.client_cpu += time.process_time() - client_before
    phase.server_cpu += server_cpu() - server_before
    phase.messages += messages
    rate = messages / elapsed
    phase.rates.append(rate)
    return rate


# Ratios and reporting ----------------------------------------------------------------------


@dataclass(frozen=True)
class Ratio:
    label: str
    numerator: str
    denominator: str
    target: float | None = None


def ratios(table: Sequence[Ratio], phases: dict[str, Phase]) -> list[dict[str, Any]]:
    """The ratios of best rates whose both phases ran, each with its target and verdict."""
    rows = []
    for r in table:
        if r.numerator not in phases or r.denominator not in phases:
            continue
        value = phases[r.numerator].best / phases[r.denominator].best
        rows.append(
            {
                "ratio": r.label,
                "value": round(value, 3),
                "target": r.target,
                "met": None if r.target is None else value >= r.target,
            }
        )
    return rows


def version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def stdout_console() -> Any:
    from rich.console import Console

    # Piped output gets room for the whole table instead of rich's 80-column default.
    return Console() if sys.stdout.isatty() else Console(width=160)


def print_ratios(console: Any, rows: list[dict[str, Any]], title: str) -> None:
    """The ratio table; a target is printed as met or NOT met, never asserted."""
    from rich.table import Table

    if not rows:
        return
    ratio_table = Table(title=title)
    ratio_table.add_column("ratio")
    ratio_table.add_column("value", justify="right")
    ratio_table.add_column("target", justify="right")
    ratio_table.add_column("")
    for row in rows:
        if row["target"] is None:
            target, verdict = "", ""
        else:
            target = f">= {row['target']:g}x"
            verdict = "[green]met[/]" if row["met"] else "[bold red]NOT met[/]"
        ratio_table.add_row(row["ratio"], f"{row['value']:.2f}x", target, verdict)
    console.print(ratio_table)


def benchmark_parser(description: str, contenders: Sequence[str]) -> argparse.ArgumentParser:
    """The options every benchmark takes; each adds its own server options."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each run")
    parser.add_argument("--batch", type=int, default=100, help="messages per claim_many")
    parser.add_argument("--reps", type=int, default=3, help="runs per contender; best is kept")
    parser.add_argument("--warmup", type=float, default=0.5, help="warm-up seconds per path")
    parser.add_argument(
        "--only",
        default=",".join(contenders),
        help=f"comma-separated subset of {','.join(contenders)}",
    )
    parser.add_argument("--json", action="store_true", help="also print the numbers as JSON")
    return parser


def chosen_contenders(
    parser: argparse.ArgumentParser, args: argparse.Namespace, contenders: Sequence[str]
) -> tuple[str, ...]:
    """Check the shared options; the contenders --only names, in the benchmark's order."""
    only = tuple(name.strip() for name in args.only.split(",") if name.strip())
    unknown = sorted(set(only) - set(contenders))
    if unknown or not only:
        parser.error(f"--only takes names from {', '.join(contenders)}, got {args.only!r}")
    if args.seconds <= 0 or args.batch < 1 or args.reps < 1 or args.warmup < 0:
        parser.error("--seconds, --batch and --reps must be positive, --warmup not negative")
    return tuple(name for name in contenders if name in only)
