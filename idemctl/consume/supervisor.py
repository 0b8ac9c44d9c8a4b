"""``consume --processes N``: N worker processes of one consumer group, kept running.

Each worker is an ``idemctl consume`` process of its own (one interpreter, one GIL), started
with the same options, writing its log lines on stderr and its progress, error and summary
on stdout in a versioned line protocol (``idemctl.consume.protocol``).
The supervisor

- replaces a worker that dies (a signal, a crash), after a back-off that doubles while
  deaths come quickly, and gives up (a crash loop) when ``crash_limit`` deaths fall within
  ``crash_window`` seconds;
- stops every worker when one exits with a code that a restart cannot mend (``FINAL``),
  and exits with it;
- turns ``stop()`` (SIGTERM, Ctrl-C) into SIGTERM for every worker, which drains, and
  ``kill()`` (a second signal) into SIGKILL;
- is done when every worker exited 0: drained (``--exit-when-idle``), stopped, or left
  without partitions.

It renders nothing: ``on_line`` gets each worker's log lines, ``on_change`` each start and
exit. Workers run in sessions of their own (a terminal's Ctrl-C reaches the supervisor
only, which passes it on once) and, on Linux, get SIGTERM if the supervisor dies.
"""

from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass, field
from typing import Any

from idemctl.consume import protocol
from idemctl.consume.metrics import OUTCOMES
from idemctl.exitcodes import ExitCode
from idemctl.processes import term_with_parent

FINAL = frozenset(
    {ExitCode.USAGE, ExitCode.NOT_PROVISIONED, ExitCode.KAFKA_UNREACHABLE, ExitCode.CONSUME_STOPPED}
)
"""Worker exit codes a restart cannot mend, and the command's own exit codes for them:
a usage or configuration error, a store not provisioned, Kafka unreachable for
``--join-timeout``, a dead-letter storm or ``--on-missing-key stop``."""

REPLACEMENT = "IDEMCTL_WORKER_RESTARTS"
"""The environment variable that tells a worker how many workers its slot had before it:
above 0, it replaces one that died (``ConsumeOptions.replacement``)."""

STUCK = ExitCode.HANDLERS_STUCK
"""A worker's exit code when handlers did not return (its --drain-timeout passed, or one
passed the hard limit): replaced while the run goes on; the run's own code while it stops."""


@dataclass
class Worker:
    """One worker slot: the process in it now, and what its processes did."""

    index: int
    proc: subprocess.Popen[bytes] | None = None
    started: float = 0.0
    restarts: int = 0
    exit: int | None = None
    """The last process's exit status (negative: the signal that ended it)."""
    done: bool = False
    """Its process exited 0: drained or stopped; it is not restarted."""
    progress: dict[str, Any] = field(default_factory=dict)
    """Its process's last progress line (the line protocol): its fields (state, partitions,
    ...) and its counts, in one mapping."""
    counts: dict[str, int] = field(default_factory=dict)
    """Counts of its processes that ended, summed (from their summaries, or the last
    progress line of one that died without one)."""
    dead_letters: dict[str, int] = field(default_factory=dict)
    last_error: str | None = None
    """The message of the ``error`` line its process wrote (the line protocol)."""

    @property
    def pid(self) -> int | None:
        return None if self.proc is None else self.proc.pid

    def total(self, name: str) -> int:
        """``name``'s count over every process of this slot, the running one included."""
        now = self.progress.get(name) if self.proc is not None else None
        return self.counts.get(name, 0) + (now if isinstance(now, int) else 0)


@dataclass
class Ending:
    """How the run ended: the exit code the command gives, and why when it is not 0."""

    code: int
    reason: str | None = None


class Supervisor:
    """Runs ``processes`` workers, each ``command`` with ``args_for(I)`` and
    ``--worker-index I`` added, in ``cwd`` with ``env``, until every one is done (see the
    module)."""

    def __init__(
        self,
        command: Sequence[str],
        processes: int,
        *,
        env: Mapping[str, str],
        cwd: str | None = None,
        args_for: Callable[[int], Sequence[str]] = lambda index: (),
        on_line: Callable[[Worker, dict[str, Any] | str], None] = lambda w, line: None,
        on_change: Callable[[Worker, str], None] = lambda w, what: None,
        crash_limit: int = 5,
        crash_window: float = 60.0,
        backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        self.command, self.env, self.cwd = list(command), dict(env), cwd
        self.args_for = args_for
        self.on_tick: Callable[[], None] = lambda: None
        """Called a few times a second while the workers run (a live view's update)."""
        self.workers = [Worker(i) for i in range(processes)]
        self.on_line, self.on_change = on_line, on_change
        self.crash_limit, self.crash_window = crash_limit, crash_window
        self.backoff, self.max_backoff = backoff, max_backoff
        self._deaths: list[float] = []
        self._due: dict[int, float] = {}
        """Worker index -> when its replacement starts."""
        self._stopping = threading.Event()
        self._killed = threading.Event()
        self._lock = threading.RLock()  # a signal handler may take it in the main thread
        self._readers: dict[int, threading.Thread] = {}
        """PID -> the thread reading its output."""
        self._summaries: dict[int, protocol.Line] = {}
        """PID -> its summary line (the line protocol), once it wrote one."""

    # -- control, from signal handlers or other threads ----------------------------------

    def stop(self) -> None:
        """Drain: SIGTERM to every worker; none is started again."""
        self._stopping.set()
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """Stop at once: SIGKILL to every worker."""
        self._stopping.set()
        self._killed.set()
        self._signal(signal.SIGKILL)

    @property
    def stopping(self) -> bool:
        return self._stopping.is_set()

    def _signal(self, signum: int) -> None:
        with self._lock:
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is None:
                    with suppress(ProcessLookupError):
                        worker.proc.send_signal(signum)

    # -- the run ------------------------------------------------------------------------

    def run(self) -> Ending:
        """Start the workers and keep them running until each is done; then how it ended."""
        try:
            for worker in self.workers:
                self._start(worker)
            return self._watch()
        finally:
            self.kill_all_left()

    def _watch(self) -> Ending:
        ending: Ending | None = None
        ticked = 0.0
        while True:
            now = time.monotonic()
            if now - ticked >= 0.25:
                ticked = now
                self.on_tick()
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is not None:
                    why = self._ended(worker, now)
                    if why is not None and ending is None:
                        ending = why
                        self.stop()
            if not self.stopping:
                for index, due in list(self._due.items()):
                    if due <= now:
                        del self._due[index]
                        self._start(self.workers[index])
            if all(w.proc is None and (w.done or self.stopping) for w in self.workers):
                break
            time.sleep(0.05)
        if ending is not None:
            return ending
        if self._killed.is_set():
            return Ending(130, "stopped at once by a second signal")
        return Ending(0)

    def _ended(self, worker: Worker, now: float) -> Ending | None:
        """Account for ``worker``'s process having exited; an Ending when the run must end."""
        proc = worker.proc
        assert proc is not None
        code = proc.wait()
        with self._lock:
            worker.proc = None
        worker.exit = code
        self._collect(worker, proc)
        self.on_change(worker, "exited")
        if code == 0:
            worker.done = True
            return None
        if self.stopping:
            if code == STUCK:  # its drain ran out of time: what it left is named
                return Ending(code, f"worker {worker.index}: {worker.last_error or '?'}")
            return None
        if code in FINAL:
            return Ending(code, f"worker {worker.index} exited {code}: {worker.last_error or '?'}")
        self._deaths = [t for t in self._deaths if t > now - self.crash_window] + [now]
        if len(self._deaths) >= self.crash_limit:
            return Ending(
                code if code > 0 else 1,
                f"crash loop: {len(self._deaths)} worker deaths within "
                f"{self.crash_window:g}s; the last, worker {worker.index}, "
                f"{_how(code)}: {worker.last_error or 'no error line'}",
            )
        delay = min(self.backoff * 2 ** (len(self._deaths) - 1), self.max_backoff)
        self._due[worker.index] = now + delay
        worker.restarts += 1
        return None

    def _start(self, worker: Worker) -> None:
        with self._lock:
            if self.stopping:
                return
            worker.progress = {}
            worker.started = time.monotonic()
            worker.proc = subprocess.Popen(  # noqa: S603 - idemctl's own argv
                [*self.command, *self.args_for(worker.index), "--worker-index", str(worker.index)],
                cwd=self.cwd,
                env={
                    **self.env,
                    "IDEMCTL_WORKER_INDEX": str(worker.index),
                    REPLACEMENT: str(worker.restarts),
                },
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                preexec_fn=term_with_parent,  # noqa: PLW1509 - only prctl, looked up before
            )
        reader = threading.Thread(
            target=self._read, args=(worker, worker.proc), name=f"idemctl-w{worker.index}"
        )
        reader.daemon = True
        reader.start()
        self._readers[worker.proc.pid] = reader
        self.on_change(worker, "started")

    def _read(self, worker: Worker, proc: subprocess.Popen[bytes]) -> None:
        """The process's stdout, the line protocol (``idemctl.consume.protocol``): its
        progress, error and summary; its stderr, its log lines, each to ``on_line`` (parsed
        where it is JSON, for relaying; nothing is read from it)."""
        assert proc.stderr is not None
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stderr, selectors.EVENT_READ)
            sel.register(proc.stdout, selectors.EVENT_READ)
            pending = {proc.stderr.fileno(): b"", proc.stdout.fileno(): b""}
            while sel.get_map():
                for key, _ in sel.select():
                    chunk = os.read(key.fd, 65536)
                    if not chunk:
                        sel.unregister(key.fileobj)
                        chunk = b"\n"  # the last line, unended
                    *lines, pending[key.fd] = (pending[key.fd] + chunk).split(b"\n")
                    reader = self._said if key.fileobj is proc.stdout else self._logged
                    for raw in lines:
                        reader(worker, proc, raw.decode("utf-8", "replace").rstrip())

    def _said(self, worker: Worker, proc: subprocess.Popen[bytes], text: str) -> None:
        line = protocol.decode(text) if text else None
        if line is None:
            return
        if line.type == "progress":
            worker.progress = {**line.fields, **line.counts}
        elif line.type == "error":
            worker.last_error = line.message
        else:
            self._summaries[proc.pid] = line

    def _logged(self, worker: Worker, proc: subprocess.Popen[bytes], text: str) -> None:
        if not text:
            return
        try:
            line: dict[str, Any] | str = json.loads(text)
        except ValueError:
            line = text
        self.on_line(worker, line if isinstance(line, dict) else text)

    def _collect(self, worker: Worker, proc: subprocess.Popen[bytes]) -> None:
        """Add the ended process's counts to its slot: its summary, else its last progress."""
        reader = self._readers.pop(proc.pid, None)
        if reader is not None:
            reader.join(timeout=5)
        summary = self._summaries.pop(proc.pid, None)
        if summary is not None:
            counts, dead = summary.counts, summary.dead_letters
        else:  # died without one: its last progress line
            counts = {k: v for k, v in worker.progress.items() if k in OUTCOMES}
            dead = {}
        for name, n in counts.items():
            worker.counts[name] = worker.counts.get(name, 0) + int(n)
        for reason, n in dead.items():
            worker.dead_letters[reason] = worker.dead_letters.get(reason, 0) + int(n)
        worker.progress = {}

    def kill_all_left(self) -> None:
        """SIGKILL any worker still running (the run ended by an exception)."""
        with self._lock:
            for worker in self.workers:
                if worker.proc is not None and worker.proc.poll() is None:
                    worker.proc.kill()
                    worker.proc.wait()


def _how(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited {code}"
