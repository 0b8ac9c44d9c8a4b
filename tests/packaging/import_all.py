"""Run inside a venv holding some install of idemctl: import every module of the package and
print, as JSON, what each gave: null, {"missing": NAME} for a package that is not installed
(also under MissingDriver), or {"error": ...} for anything else."""

from __future__ import annotations

import importlib
import json
from pathlib import Path

import idemctl
from idemctl.errors import MissingDriver


def modules() -> list[str]:
    root = Path(idemctl.__file__).parent
    return sorted(
        ".".join(("idemctl", *p.relative_to(root).with_suffix("").parts)).removesuffix(".__init__")
        for p in root.rglob("*.py")
        if p.name != "__main__.py"  # runs the CLI
    )


def outcome(name: str) -> dict[str, str] | None:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        return {"missing": str(exc.name)}
    except MissingDriver as exc:
        cause = exc.__cause__
        if isinstance(cause, ModuleNotFoundError):
            return {"missing": str(cause.name)}
        return {"error": f"MissingDriver without a missing module: {exc}"}
    except Exception as exc:
        return {"error": repr(exc)}
    return None


if __name__ == "__main__":
    print(json.dumps({name: outcome(name) for name in modules()}))
