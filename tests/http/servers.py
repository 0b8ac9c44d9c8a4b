"""The example apps under real servers: uvicorn (ASGI) and gunicorn (WSGI, 2 workers of 8
threads), as a user runs them from the project root, on 127.0.0.1 and a free port.

Each server leads a process group of its own (``setsid`` execs it in place, so its PID is
the server's): ``kill()`` sends SIGKILL to the group, gunicorn's workers included, as when
a host dies mid-request; ``stop()`` sends SIGTERM to the server's PID, then reaps the group.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
from pathlib import Path

from tests.servers import HOST, ServerProcess, free_port, http_answers

REPO = Path(__file__).resolve().parents[2]

APPS = {
    "uvicorn": ["-m", "uvicorn", "--app-dir", str(REPO), "--no-access-log"],
    "gunicorn": ["-m", "gunicorn", "--chdir", str(REPO), "-w", "2", "--threads", "8"],
}
"""Each server's command line after ``python``, without the app and the address: the app
is imported from the project root, as a user runs it there."""
MODULES = {"uvicorn": "examples.http.asgi_app:app", "gunicorn": "examples.http.wsgi_app:app"}


class AppServer(ServerProcess):
    """An example app under ``kind`` (uvicorn or gunicorn) on the store at ``store``, its
    ledger at ``ledger``; ``env``: more of the app's settings (``IDEMCTL_LEASE``, ...)."""

    def __init__(
        self, kind: str, store: str, ledger: Path, directory: Path, *, app: str = "", **env: str
    ) -> None:
        self.kind, self.store, self.ledger, self.extra = kind, store, ledger, env
        self.app = app or MODULES[kind]
        port = free_port()
        super().__init__(port, directory / f"{kind}-{port}.log", pick_port=free_port)
        self.name = kind

    @property
    def base_url(self) -> str:
        return f"http://{HOST}:{self.port}"

    def ready(self) -> bool:
        return http_answers(self.port)

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("IDEMCTL_")}
        env.update(IDEMCTL_STORE=self.store, LEDGER=str(self.ledger), **self.extra)
        return env

    def command_line(self, die_with_parent: bool = False) -> list[str]:
        setsid = shutil.which("setsid")
        assert setsid is not None, "setsid (util-linux) is needed to kill a server's workers"
        address = ["--host", HOST, "--port"] if self.kind == "uvicorn" else ["-b"]
        where = str(self.port) if self.kind == "uvicorn" else f"{HOST}:{self.port}"
        return [setsid, sys.executable, *APPS[self.kind], self.app, *address, where]

    def kill(self) -> None:
        """SIGKILL to the server and its workers at once: a host gone mid-request."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        super().kill()

    def _after_exit(self, timeout: float) -> None:
        """No worker outlives its server (the group is the server's PID)."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
