#!/usr/bin/env python3
"""Write completions/ for bash, zsh and fish from the idemctl app (typer's scripts).

Run after upgrading typer; tests/cli/test_completions.py fails while the files are stale.
Each script asks `idemctl` itself what to complete, so new commands and options need
no new script.
"""

from __future__ import annotations

import sys
from pathlib import Path

from typer.completion import get_completion_script

PROG = "idemctl"
COMPLETE_VAR = "_IDEMCTL_COMPLETE"
FILES = {"bash": "idemctl.bash", "zsh": "_idemctl", "fish": "idemctl.fish"}


def scripts() -> dict[str, str]:
    """File name -> content, as the installed typer generates them."""
    return {
        name: get_completion_script(prog_name=PROG, complete_var=COMPLETE_VAR, shell=shell)
        .strip() + "\n"
        for shell, name in FILES.items()
    }  # fmt: skip


def main() -> None:
    out = Path(__file__).resolve().parents[1] / "completions"
    out.mkdir(exist_ok=True)
    for name, content in scripts().items():
        (out / name).write_text(content, encoding="utf-8")
        print(f"wrote {out / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
