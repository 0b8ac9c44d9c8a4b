"""Records written by Powertools' own ``idempotent_function`` (aws-lambda-powertools, the real
package: never hand-made items), on DynamoDB (moto's server) or Redis (redis-server).

A ``Job`` says where (``Store``: the persistence layer and its constructor's arguments),
which payload, and how the invocation ends:

- ``complete``: the function returns; Powertools saves COMPLETED (or replays a record).
- ``hang``: the function blocks until its process is SIGKILLed, in a process of its own
  (``python -m tests.powertools.writers JOBS``, see ``Hanging``): the record stays INPROGRESS,
  as a Lambda timeout or a crash leaves it.
- ``crash``: the function raises a BaseException that Powertools does not catch (it handles
  ``Exception`` only): nothing after the function's start runs, as on SIGKILL; in this
  process, for the tests that need the record and not the kill.

With ``remaining_ms`` the config has a Lambda context registered (a fake whose
``get_remaining_time_in_millis()`` says so): Powertools writes ``in_progress_expiration`` =
now + remaining_ms, so 1000 ms makes a record stale a second later and 120000 ms a live one;
without it, no in-progress expiry (blocked until ``expiration``).

Each run of the function body appends a line to ``runs_file``: how many times it ran.

The decorated functions live in this module, whose name is ``tests.powertools.writers``
however it runs (``__main__`` imports it by name): Powertools' key prefix is
``test-func.tests.powertools.writers.process`` (``AWS_LAMBDA_FUNCTION_NAME`` unset).
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
import uuid
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

HOST = "127.0.0.1"
REGION = "us-east-1"
READY_TIMEOUT = 30.0
LAMBDA_ENV = ("AWS_LAMBDA_FUNCTION_NAME", "POWERTOOLS_IDEMPOTENCY_DISABLED")
"""Environment that changes what Powertools writes: unset for every writer."""


@dataclass(frozen=True)
class Store:
    """A Powertools persistence layer: ``kind`` dynamodb (``table`` on ``endpoint_url``) or
    redis (``port``, ``db``); ``layer`` its constructor's own arguments (key_attr,
    sort_key_attr, static_pk_value, expiry_attr, status_attr, ...)."""

    kind: str
    table: str = ""
    endpoint_url: str = ""
    port: int = 0
    db: int = 0
    layer: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Job:
    store: Store
    payload: Any
    mode: str = "complete"
    """complete, hang or crash."""
    remaining_ms: int | None = None
    """A registered Lambda context with this much time left; None: no context."""
    expires_after_seconds: int = 3600
    event_key_jmespath: str = ""
    payload_validation_jmespath: str = ""
    hash_function: str = "md5"
    key_prefix: str | None = None
    function: str = "process"
    """``process`` or ``Orders.handle`` (a qualname with a dot)."""
    runs_file: str | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> Job:
        return cls(**{**doc, "store": Store(**doc["store"])})


@dataclass(frozen=True)
class Outcome:
    """What Powertools' call did: ``ran`` (the function ran and returned), ``replayed`` (a
    COMPLETED record answered), ``in_progress`` (IdempotencyAlreadyInProgressError),
    ``crashed`` (the function died inside), ``error`` (anything else)."""

    kind: str
    result: Any = None
    error: str = ""


class Crashed(BaseException):
    """The invocation dies inside the function: Powertools neither deletes its record nor
    saves a result."""


class FakeLambdaContext:
    """All Powertools asks of a Lambda context."""

    def __init__(self, remaining_ms: int) -> None:
        self.remaining_ms = remaining_ms

    def get_remaining_time_in_millis(self) -> int:
        return self.remaining_ms


# The decorated functions -------------------------------------------------------------------

_ran = threading.local()
_entered: queue.Queue[int] = queue.Queue()
_forever = threading.Event()


def _body(order: Any, job: Job) -> dict[str, Any]:
    run = uuid.uuid4().hex
    _ran.run = run
    if job.runs_file:
        with open(job.runs_file, "a", encoding="utf-8") as f:
            f.write(run + "\n")
    if job.mode == "hang":
        _entered.put(os.getpid())
        _forever.wait()  # until SIGKILL
    if job.mode == "crash":
        raise Crashed
    return {"order": order, "run": run}


def process(*, order: Any, job: Job) -> dict[str, Any]:
    return _body(order, job)


class Orders:
    @staticmethod
    def handle(*, order: Any, job: Job) -> dict[str, Any]:
        return _body(order, job)


def consumer_handler(event: Any) -> None:
    """A handler ``idemctl consume`` can import: the tests that it refuses a Powertools store
    get past the handler check to the store."""


FUNCTIONS = {"process": process, "Orders.handle": Orders.handle}


def function_name(job: Job) -> str:
    """``module.qualname`` of the job's function, as Powertools names it."""
    fn = FUNCTIONS[job.function]
    return f"{fn.__module__}.{fn.__qualname__}"


# Powertools' side ----------------------------------------------------------------------------


def persistence_layer(store: Store) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # RedisCachePersistenceLayer is deprecated for v4
        if store.kind == "dynamodb":
            import boto3
            from aws_lambda_powertools.utilities.idempotency import DynamoDBPersistenceLayer

            client = boto3.client(
                "dynamodb",
                endpoint_url=store.endpoint_url,
                region_name=REGION,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            return DynamoDBPersistenceLayer(
                table_name=store.table, boto3_client=client, **store.layer
            )
        if store.kind == "redis":
            from aws_lambda_powertools.utilities.idempotency.persistence.cache import (
                CachePersistenceLayer,
            )

            return CachePersistenceLayer(
                host=HOST, port=store.port, db_index=store.db, ssl=False, **store.layer
            )
    raise ValueError(f"unknown store kind {store.kind!r}")


def config_of(job: Job) -> Any:
    from aws_lambda_powertools.utilities.idempotency import IdempotencyConfig

    config = IdempotencyConfig(
        event_key_jmespath=job.event_key_jmespath,
        payload_validation_jmespath=job.payload_validation_jmespath,
        expires_after_seconds=job.expires_after_seconds,
        hash_function=job.hash_function,
    )
    if job.remaining_ms is not None:
        config.register_lambda_context(FakeLambdaContext(job.remaining_ms))  # type: ignore[arg-type]
    return config


def call(job: Job) -> Outcome:
    """One call of the job's function through Powertools' ``idempotent_function``, with a
    persistence layer of its own (as a fresh Lambda execution environment has)."""
    from aws_lambda_powertools.utilities.idempotency import idempotent_function
    from aws_lambda_powertools.utilities.idempotency.exceptions import (
        IdempotencyAlreadyInProgressError,
    )

    decorated = idempotent_function(
        FUNCTIONS[job.function],
        data_keyword_argument="order",
        persistence_store=persistence_layer(job.store),
        config=config_of(job),
        key_prefix=job.key_prefix,
    )
    _ran.run = None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Couldn't determine the remaining time left"
            result = decorated(order=job.payload, job=job)
    except Crashed:
        return Outcome("crashed")
    except IdempotencyAlreadyInProgressError as exc:
        return Outcome("in_progress", error=str(exc))
    except Exception as exc:
        return Outcome("error", error=f"{type(exc).__name__}: {exc}")
    ran = _ran.run is not None and isinstance(result, dict) and result.get("run") == _ran.run
    return Outcome("ran" if ran else "replayed", result)


def key_of(job: Job, function: str | None = None) -> str:
    """The idempotency key Powertools computes for the job's payload: its own
    ``_get_hashed_idempotency_key``, configured as ``idempotent_function`` configures it
    (for ``function``, a ``module.qualname``, in place of the job's own)."""
    from aws_lambda_powertools.utilities.idempotency.persistence.base import (
        BasePersistenceLayer,
    )

    class KeyOnly(BasePersistenceLayer):
        def _get_record(self, idempotency_key: Any) -> Any:
            raise NotImplementedError

        def _put_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _update_record(self, data_record: Any) -> None:
            raise NotImplementedError

        def _delete_record(self, data_record: Any) -> None:
            raise NotImplementedError

    layer = KeyOnly()  # type: ignore[no-untyped-call]
    layer.configure(config_of(job), function or function_name(job), job.key_prefix)
    key = layer._get_hashed_idempotency_key(job.payload)
    assert key is not None, job
    return str(key)


def runs(path: str | Path) -> int:
    """How many times a function body ran with this ``runs_file``."""
    try:
        return len(Path(path).read_text(encoding="utf-8").splitlines())
    except FileNotFoundError:
        return 0


# The process: python -m tests.powertools.writers JOBS ---------------------------------------


def main(argv: list[str]) -> int:
    """Runs the jobs of the JSON list ``argv[0]``: complete and crash ones in turn, one
    outcome per line; then hang ones, each in a thread, and once every one is inside its
    function prints ``{"ready": [pid, ...]}`` and waits for its SIGKILL."""
    jobs = [Job.from_json(doc) for doc in json.loads(argv[0])]
    for job in jobs:
        if job.mode != "hang":
            print(json.dumps(asdict(call(job))), flush=True)
    hanging = [job for job in jobs if job.mode == "hang"]
    if not hanging:
        return 0
    failed: queue.Queue[Outcome] = queue.Queue()

    def run(job: Job) -> None:
        failed.put(call(job))  # only when it did not hang

    for job in hanging:
        threading.Thread(target=run, args=(job,), daemon=True).start()
    entered: list[int] = []
    deadline = time.monotonic() + READY_TIMEOUT
    while len(entered) < len(hanging):
        if not failed.empty():
            print(json.dumps({"failed": asdict(failed.get())}), flush=True)
            return 1
        if time.monotonic() > deadline:
            print(json.dumps({"failed": "timed out"}), flush=True)
            return 1
        with contextlib.suppress(queue.Empty):
            entered.append(_entered.get(timeout=0.01))
    print(json.dumps({"ready": entered}), flush=True)
    _forever.wait()
    return 0


def writer_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in LAMBDA_ENV}
    env.setdefault("AWS_ACCESS_KEY_ID", "testing")
    env.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    env["AWS_EC2_METADATA_DISABLED"] = "true"
    return env


class Hanging:
    """A writer process whose ``hang`` jobs block inside the function: ``start`` waits until
    every one is inside (its INPROGRESS record written), ``kill`` SIGKILLs it by its PID."""

    def __init__(self, jobs: list[Job], log: Path) -> None:
        self.jobs = jobs
        self.log = log
        self.proc: subprocess.Popen[str] | None = None

    def start(self) -> Hanging:
        root = Path(__file__).resolve().parents[2]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-W", "ignore", "-m", "tests.powertools.writers",
                 json.dumps([j.to_json() for j in self.jobs])],
                cwd=root, env=writer_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=log, text=True,
            )  # fmt: skip
        lines: queue.Queue[str] = queue.Queue()
        stdout = self.proc.stdout
        assert stdout is not None

        def read() -> None:
            for line in stdout:
                lines.put(line)

        threading.Thread(target=read, daemon=True).start()
        try:
            line = lines.get(timeout=READY_TIMEOUT)
        except queue.Empty:
            line = ""
        doc = json.loads(line) if line.startswith("{") else {}
        if "ready" not in doc:
            self.kill()
            raise AssertionError(f"writer not ready: {line!r}\n{self.log.read_text()[-3000:]}")
        assert doc["ready"] == [self.proc.pid] * len(self.jobs)
        return self

    def kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout=10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


@contextlib.contextmanager
def hanging(jobs: list[Job], log: Path) -> Iterator[Hanging]:
    """The jobs hang in a writer process until the block ends (or ``kill``); SIGKILLed by
    PID in any case."""
    writer = Hanging([replace(j, mode="hang") for j in jobs], log)
    try:
        yield writer.start()
    finally:
        writer.kill()


def hang_and_kill(jobs: list[Job], log: Path) -> None:
    """The jobs' records left INPROGRESS by a writer SIGKILLed inside the function."""
    with hanging(jobs, log) as writer:
        writer.kill()


if __name__ == "__main__":
    import importlib

    # By its name, not as __main__: the decorated functions' __module__ is in their keys.
    sys.exit(importlib.import_module("tests.powertools.writers").main(sys.argv[1:]))
