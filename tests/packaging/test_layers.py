"""The layers of ARCHITECTURE.md hold in the import graph: data flows one way (front ends,
then operations, then attempts, then stores), the library never imports the CLI, consume
asks the runner and never the store, and the Kafka front ends (consume, FastStream, audit)
share ``idemctl.kafka`` rather than import one another. The contracts are pyproject.toml's
``[tool.importlinter]``; import-linter checks them, and fails on an import that breaks one
(shown on a copy of the package with one such import added)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
LINT = Path(sys.executable).with_name("lint-imports")


def lint(root: Path) -> subprocess.CompletedProcess[str]:
    """lint-imports on the package under ``root`` with the repository's contracts."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT), "--config", str(REPO / "pyproject.toml"), "--no-cache"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_every_contract_is_kept() -> None:
    done = lint(REPO)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 4 kept, 0 broken." in done.stdout


def test_a_store_that_imports_the_cli_breaks_them(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "idemctl", tmp_path / "idemctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    base = tmp_path / "idemctl" / "stores" / "base.py"
    base.write_text(base.read_text() + "\nfrom idemctl.cli import render  # noqa\n")
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "idemctl.stores is not allowed to import idemctl.cli" in done.stdout
    assert "the library never imports the CLI" in done.stdout


def test_faststream_importing_consume_breaks_them(tmp_path: Path) -> None:
    shutil.copytree(
        REPO / "idemctl", tmp_path / "idemctl", ignore=shutil.ignore_patterns("__pycache__")
    )
    middleware = tmp_path / "idemctl" / "faststream" / "middleware.py"
    middleware.write_text(
        middleware.read_text() + "\nfrom idemctl.consume.options import COMPLETE_BATCH  # noqa\n"
    )
    done = lint(tmp_path)
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the Kafka front ends share idemctl.kafka, not each other BROKEN" in done.stdout
    assert "idemctl.faststream is not allowed to import idemctl.consume" in done.stdout


def import_cycles(package: str) -> list[list[str]]:
    """The import graph's cycles: its strongly connected components of more than one module
    (Tarjan's), imports made only for type checking left out."""
    import grimp

    graph = grimp.build_graph(package, exclude_type_checking_imports=True)
    edges = {m: graph.find_modules_directly_imported_by(m) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for imported in edges[module]:
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_at_most_three_import_cycles() -> None:
    # Each left is a store package whose operator module reads a tunable batch size from the
    # package at each call (tests set it there): stores.postgres, stores.redis, stores.dynamodb.
    cycles = import_cycles("idemctl")
    assert len(cycles) <= 3, cycles
    assert all(c[0].startswith("idemctl.stores.") for c in cycles), cycles


def test_the_cycle_finder_finds_an_injected_cycle(tmp_path: Path) -> None:
    (tmp_path / "loop").mkdir()
    (tmp_path / "loop" / "__init__.py").write_text("")
    (tmp_path / "loop" / "a.py").write_text("from loop import b\n")
    (tmp_path / "loop" / "b.py").write_text("from loop import c\n")
    (tmp_path / "loop" / "c.py").write_text("from loop import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        assert import_cycles("loop") == [["loop.a", "loop.b", "loop.c"]]
    finally:
        sys.path.remove(str(tmp_path))
