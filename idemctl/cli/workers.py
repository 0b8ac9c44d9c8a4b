"""``idemctl consume --processes N``: the supervisor's side of the command line. It makes
the workers' command from the options given, shows one live view (a row per worker), one
stream of log lines (each with its ``worker``), one ``/metrics``, ``/healthz`` and
``/readyz`` for the whole, and one summary. ``idemctl.consume.supervisor`` runs them."""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, nullcontext
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from idemctl.cli.common import Settings, emit_json, note, report_error, store_fields
from idemctl.cli.live import consume_status
from idemctl.cli.logs import log_line, print_line
from idemctl.cli.running import stop_on_signals
from idemctl.consume.metrics import OUTCOMES
from idemctl.consume.supervisor import Supervisor, Worker
from idemctl.errors import ConfigError, IdemctlError
from idemctl.kafka.options import Summary
from idemctl.operate.documents import consume as consume_document

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

# The consume options a worker does not take from the command line as given: the
# supervisor's own, the global ones (a worker gets the store through its environment),
# and those it gives every worker itself.
OWN = frozenset(
    {
        "processes", "worker_index", "metrics_port", "metrics_host", "log_format", "brokers",
        "kafka_config", "store", "config", "profile", "json", "verbose", "no_color",
    }
)  # fmt: skip


def processes_wanted(value: str) -> int:
    """``--processes``: a whole number from 1, or ``auto`` for the cores this process may
    run on."""
    if value == "auto":
        if hasattr(os, "sched_getaffinity"):
            return len(os.sched_getaffinity(0))
        return os.cpu_count() or 1
    try:
        n = int(value)
    except ValueError:
        n = 0
    if not 1 <= n <= 1024:
        raise ConfigError(f"--processes {value}: use a whole number from 1 to 1024, or auto")
    return n


def worker_args(ctx: typer.Context) -> list[str]:
    """The consume options given, as a worker's command line takes them."""
    args: list[str] = []
    for param in ctx.command.params:
        name = param.name or ""
        value = ctx.params.get(name)
        if name in OWN or value is None or value == param.default or not param.opts:
            continue
        flag = max(param.opts, key=len)
        if getattr(param, "is_flag", False):
            args += [flag] if value else []
        elif isinstance(value, list | tuple):
            for item in value:
                args += [flag, _text(item)]
        else:
            args += [flag, _text(value)]
    return args


def _text(value: Any) -> str:
    return str(value.value if isinstance(value, Enum) else value)


@contextmanager
def worker_setup(
    current: Settings, store_url: str, brokers: str, kafka: Mapping[str, str]
) -> Iterator[tuple[list[str], dict[str, str]]]:
    """The start of every worker's command, and its environment: the store URL and the
    librdkafka settings go through the environment (a config file of ``${NAME}``s), never
    on a command line that ``ps`` shows."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
    env |= {"IDEMCTL_STORE": store_url, "PYTHONUNBUFFERED": "1"}
    env |= {f"IDEMCTL_WORKER_KAFKA_{i}": v for i, v in enumerate(kafka.values())}
    config = {"kafka": {k: f"${{IDEMCTL_WORKER_KAFKA_{i}}}" for i, k in enumerate(kafka)}}
    remove_orphans()
    with tempfile.TemporaryDirectory(prefix=WORKERS_DIR) as folder:
        (Path(folder) / OWNER).write_text(str(os.getpid()))
        path = Path(folder) / "idemctl.yaml"
        path.write_text(json.dumps(config))  # JSON is YAML
        command = [sys.executable, "-m", "idemctl", "--config", str(path)]
        command += [f"-{'v' * current.verbose}"] if current.verbose else []
        command += ["consume", "--brokers", brokers, "--log-format", "json"]
        yield command, env


WORKERS_DIR = "idemctl-workers-"
OWNER = "supervisor.pid"


def remove_orphans(root: str | None = None) -> list[Path]:
    """Remove the temporary directories of supervisors that died without removing their own
    (SIGKILL): each names its supervisor's PID; one whose PID runs, or that names none, is
    left alone. The directories removed."""
    removed = []
    for folder in Path(root or tempfile.gettempdir()).glob(WORKERS_DIR + "*"):
        try:
            owner = int((folder / OWNER).read_text())
            if folder.stat().st_uid != os.getuid():
                continue
            os.kill(owner, 0)
        except ProcessLookupError:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
        except (OSError, ValueError):  # no PID written, not ours, or it runs
            continue
    return removed


def totals(workers: list[Worker]) -> Summary:
    """The whole run's summary: every worker's counts, and the partitions they hold now."""
    counts: Counter[str] = Counter()
    dead: Counter[str] = Counter()
    for w in workers:
        names = set(w.counts) | {k for k, v in w.progress.items() if isinstance(v, int)}
        counts.update({n: w.total(n) for n in names if n in OUTCOMES})
        dead.update(w.dead_letters)
    live = [w.progress for w in workers if w.proc is not None and w.progress]
    lags = [p["lag"] for p in live if isinstance(p.get("lag"), int)]
    states = Counter(str(p.get("state", "starting")) for p in live)
    return Summary(
        counts=+counts,
        dead_letters=dead,
        paused=sum(int(p.get("paused_partitions", 0)) for p in live),
        partitions=sum(int(p.get("partitions", 0)) for p in live),
        state=", ".join(f"{n} {s}" for s, n in sorted(states.items())) or "starting",
        lag=sum(lags) if lags else None,
        stalled=sum(int(p.get("stalled_partitions", 0)) for p in live),
    )


def worker_rows(workers: list[Worker]) -> Any:
    """The live view's row per worker."""
    from rich.table import Table

    table = Table(box=None, padding=(0, 1), header_style="dim")
    for column in ("worker", "pid", "state", "partitions", "lag", "executed", "replayed",
                   "retried", "dead_lettered", "busy", "restarts"):  # fmt: skip
        table.add_column(column.replace("_", " "), justify="left" if column == "state" else "right")
    for w in workers:
        p = w.progress
        state = p.get("state") if w.proc is not None else ("done" if w.done else "restarting")
        cells = [p.get(n) for n in ("partitions", "lag")]
        table.add_row(
            str(w.index), str(w.pid or "-"), str(state or "starting"),
            *("-" if c is None else str(c) for c in cells),
            *(str(w.total(n)) for n in ("executed", "replayed", "retried", "dead_lettered")),
            str(w.total("busy")),
            str(w.restarts),
        )  # fmt: skip
    return table


class WorkerLines:
    """What a worker writes, on the supervisor's stderr: its log lines with its index (in the
    command's ``--log-format``), its ``store:`` line left out (the supervisor writes one for
    the whole). Its progress and summary come in the line protocol, not as log lines."""

    def __init__(self, current: Settings) -> None:
        self.current = current

    def line(self, worker: Worker, line: dict[str, Any] | str) -> None:
        if isinstance(line, str):
            print_line(self.current.err, f"[worker {worker.index}] {line}")
            return
        msg = str(line.get("msg", ""))
        if msg.startswith("store: "):
            return
        fields = {k: v for k, v in line.items() if k not in ("ts", "level", "logger", "msg")}
        level = str(line.get("level", "info"))
        out = log_line(
            self.current.records_format, level, msg, {"worker": worker.index, **fields},
            logger=str(line.get("logger", "idemctl.consume")),
        )  # fmt: skip
        print_line(self.current.err, out)

    def change(self, worker: Worker, what: str) -> None:
        if what == "started":
            text = f"worker {worker.index} started (pid {worker.pid})"
            note(self.current, text, fields={"worker": worker.index, "pid": worker.pid})
        elif worker.exit:
            how = f"exited {worker.exit}" if worker.exit > 0 else f"killed by signal {-worker.exit}"
            note(self.current, f"worker {worker.index} {how}", level="warning",
                 fields={"worker": worker.index, "exit": worker.exit})  # fmt: skip


def supervise(
    ctx: typer.Context,
    current: Settings,
    processes: int,
    store_url: str,
    shown_url: str,
    brokers: str,
    kafka: Mapping[str, str],
    topics: list[str],
    metrics_host: str,
    metrics_port: int | None,
) -> None:
    """Run ``processes`` workers of the consume command ``ctx`` holds, to the end, on the
    store at ``store_url`` (``shown_url``: its password hidden)."""
    from idemctl.metrics import serving

    ports = [_free_port() for _ in range(processes)] if metrics_port is not None else []
    lines = WorkerLines(current)
    with worker_setup(current, store_url, brokers, kafka) as (command, env):
        supervisor = Supervisor(
            [*command, *worker_args(ctx)],
            processes,
            env=env,
            args_for=lambda i: (
                ["--metrics-port", str(ports[i]), "--metrics-host", "127.0.0.1"] if ports else []
            ),
            on_line=lines.line,
            on_change=lines.change,
        )
        header = {"topics": ", ".join(topics), "group": str(ctx.params["group"])}
        header |= {"store": shown_url, "processes": str(processes)}
        status = consume_status(current, header, rows=lambda: worker_rows(supervisor.workers))
        supervisor.on_tick = lambda: status.update(totals(supervisor.workers))

        def register(registry: CollectorRegistry) -> Any:
            return _aggregate(registry, figures)

        figures = Figures(ports, supervisor)
        with (
            serving(register, metrics_host, metrics_port),
            figures.refreshed() if ports else nullcontext(),
            stop_on_signals(current, supervisor.stop, supervisor.kill),
            status,
        ):
            ending = supervisor.run()
    summary = totals(supervisor.workers)
    workers = [
        {
            "index": w.index,
            "restarts": w.restarts,
            "exit": w.exit,
            "counts": dict(sorted(w.counts.items())),
            "dead_letters": dict(sorted(w.dead_letters.items())),
        }
        for w in supervisor.workers
    ]
    if current.json:
        document = consume_document.document(
            store_fields(ctx, shown_url), topics, str(ctx.params["group"]), summary
        )
        emit_json({**document, "processes": processes, "workers": workers})
    else:
        counts = sorted(summary.counts.items())
        shown = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in counts) or "nothing"
        restarts = sum(w.restarts for w in supervisor.workers)
        note(
            current,
            f"consumed {summary.finished} message(s) in {processes} processes "
            f"({restarts} restart(s)): {shown}",
            fields={
                "finished": summary.finished,
                "processes": processes,
                "restarts": restarts,
                **dict(counts),
            },
        )
    if ending.code:
        error = IdemctlError(ending.reason or f"exit {ending.code}")
        if current.log_format in ("json", "logfmt"):
            note(current, str(error), level="error")
        else:
            report_error(error, current.err)
        raise typer.Exit(ending.code)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


class Figures:
    """The workers' metrics as one: each running process's exposition, scraped now, and
    the last exposition of each process that ended, whose counters still count. Refreshed
    every ``EVERY`` seconds between scrapes, so an ended process's last figures are at most
    that old (a worker that exits on its own, idle, loses nothing; one killed, its last
    second)."""

    EVERY = 1.0

    def __init__(self, ports: list[int], supervisor: Supervisor) -> None:
        self.ports, self.supervisor = ports, supervisor
        self._last: dict[int, str] = {}
        """PID -> its last exposition."""
        self._ended: list[str] = []
        self._lock = threading.Lock()

    def texts(self) -> tuple[list[str], list[str]]:
        """(the running processes' expositions, the ended ones' last)."""
        running: dict[int, str] = {}
        for port, worker in zip(self.ports, self.supervisor.workers, strict=True):
            pid = worker.pid
            if pid is not None:
                answer = _get(port, "/metrics")
                if answer is not None and answer[0] == 200:
                    running[pid] = answer[1]
        with self._lock:
            self._last.update(running)
            alive = {w.pid for w in self.supervisor.workers if w.pid is not None}
            for pid in [p for p in self._last if p not in alive]:
                self._ended.append(self._last.pop(pid))
            return [self._last[p] for p in alive if p in self._last], list(self._ended)

    def families(self) -> list[Any]:
        from idemctl.metrics import merged

        running, ended = self.texts()
        return merged(running, ended)

    @contextmanager
    def refreshed(self) -> Iterator[None]:
        """Refresh the figures every ``EVERY`` seconds inside the block."""
        done = threading.Event()

        def refresh() -> None:
            while not done.wait(self.EVERY):
                self.texts()

        thread = threading.Thread(target=refresh, name="idemctl-figures", daemon=True)
        thread.start()
        try:
            yield
        finally:
            done.set()
            thread.join(timeout=5)


def _aggregate(registry: CollectorRegistry, figures: Figures) -> Any:
    """The workers' metrics, summed, in ``registry``; ready while every running worker is."""
    from idemctl.metrics import Scraped

    registry.register(Scraped(figures.families))

    def ready() -> str | None:
        why = []
        for port, worker in zip(figures.ports, figures.supervisor.workers, strict=True):
            if worker.done:
                continue
            answer = _get(port, "/readyz") if worker.proc is not None else None
            if answer is None:
                why.append(f"worker {worker.index}: not running")
            elif answer[0] != 200:
                why.append(f"worker {worker.index}: {answer[1].strip()}")
        return "; ".join(why) or None

    return ready


def _get(port: int, path: str) -> tuple[int, str] | None:
    """A worker's answer at ``path``; None when it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=2) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()
    except OSError:
        return None
