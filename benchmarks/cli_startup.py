"""How long ``idemctl`` takes to answer, against what Python takes to import typer and rich.

Each command runs ``--runs`` times in a fresh interpreter, alternating with the baseline
(``python -c "import typer, rich.console"``) so both see the same machine; the median wall
time of each, and its ratio to the baseline's median, are printed. Also shown: a two-command
typer app's ``COMMAND --help`` (typer's own floor: typer 0.29 and later import pydantic to
coerce a command's values) and ``stats`` on a fresh SQLite store.

    .venv/bin/python benchmarks/cli_startup.py [--runs 15]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TINY = """\
import typer
app = typer.Typer()
@app.command()
def a(x: int = 1) -> None:
    "Do a."
@app.command()
def b() -> None:
    "Do b."
app()
"""

TARGETS = {"--version": 1.5, "--help": 1.5, "stats --help": 1.5, "stats (SQLite)": 2.0}


def timed(argv: list[str], cwd: Path) -> float:
    started = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    args = parser.parse_args()
    python = sys.executable
    with tempfile.TemporaryDirectory() as folder:
        here = Path(folder)
        (here / "tiny.py").write_text(TINY)
        store = f"sqlite:///{here}/keys.db"
        idemctl = [python, "-m", "idemctl"]
        subprocess.run(
            [*idemctl, "--store", store, "init"], cwd=here, check=True, capture_output=True
        )
        commands = {
            "baseline: import typer, rich.console": [python, "-c", "import typer, rich.console"],
            "--version": [*idemctl, "--version"],
            "--help": [*idemctl, "--help"],
            "stats --help": [*idemctl, "stats", "--help"],
            "consume --help": [*idemctl, "consume", "--help"],
            "stats (SQLite)": [*idemctl, "--store", store, "stats"],
            "typer app: a --help": [python, "tiny.py", "a", "--help"],
        }
        times: dict[str, list[float]] = {name: [] for name in commands}
        for argv in commands.values():  # warm the file cache and .pyc files
            timed(argv, here)
        for _ in range(args.runs):
            for name, argv in commands.items():
                times[name].append(timed(argv, here))
    base = statistics.median(times["baseline: import typer, rich.console"])
    print(f"{'command':<40} {'median':>8} {'ratio':>7}  target")
    for name, values in times.items():
        median = statistics.median(values)
        target = TARGETS.get(name)
        verdict = (
            ""
            if target is None
            else f"<= {target}x: {'met' if median / base <= target else 'NOT met'}"
        )
        print(f"{name:<40} {median * 1000:>6.0f}ms {median / base:>6.2f}x  {verdict}")


if __name__ == "__main__":
    main()
