"""scripts/unasync.py: what it makes of an async module's syntax tree (the ``is_async()``
escape included), and that the sync modules in the tree are what their async originals give
(the same check scripts/test runs), which fails on a sync module edited by hand."""

from __future__ import annotations

import ast
import importlib.util
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "unasync.py"


def _script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("unasync", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _body(out: str) -> str:
    """The sync module past its two header lines, as ``ast.unparse`` writes it."""
    return ast.unparse(ast.parse(out.split("\n", 2)[2]))


def _same(out: str, expected: str) -> None:
    assert _body(out) == ast.unparse(ast.parse(expected))


def test_async_syntax_and_names_become_their_sync_forms() -> None:
    unasync = _script()
    original = "idemctl/aio/attempt.py"
    text = (
        "from collections.abc import Awaitable, AsyncIterator\n"
        "from idemctl.stores.base_async import AsyncStore\n"
        "import idemctl.aio.beat\n"
        "async def run(store: AsyncStore, again: Awaitable[int]) -> AsyncIterator[int]:\n"
        "    async with store.transaction('k') as unit:\n"
        "        await unit.complete()\n"
        "    async for x in store.keys():\n"
        "        pass\n"
        "    rows = [r async for r in store.rows()]\n"
        "    store.sync.AsyncStore = AsyncStore\n"
        "    AsyncStorefront = 1\n"
    )
    out = unasync.unasync(text, original)
    _same(
        out,
        "from collections.abc import Awaitable, Iterator\n"
        "from idemctl.stores.base import Store\n"
        "import idemctl.runner.beat\n"
        "def run(store: Store, again: int) -> Iterator[int]:\n"
        "    with store.transaction('k') as unit:\n"
        "        unit.complete()\n"
        "    for x in store.keys():\n"
        "        pass\n"
        "    rows = [r for r in store.rows()]\n"
        "    store.sync.Store = Store\n"
        "    AsyncStorefront = 1\n",  # whole names only
    )
    assert "Do not edit" in out.split("\n", 2)[1]
    assert original in out.split("\n", 1)[0]


def test_the_is_async_escape_keeps_the_sync_branch_alone() -> None:
    unasync = _script()
    text = (
        "import asyncio, time\n"
        "from idemctl._unasync import is_async\n"
        "async def pause(give_back, backoff: float) -> None:\n"
        "    if is_async():\n"
        "        await asyncio.shield(give_back())\n"
        "        await asyncio.sleep(backoff)\n"
        "    else:\n"
        "        give_back()\n"
        "        time.sleep(backoff)\n"
        "    if ready():\n"  # any other test stays as it is
        "        await go()\n"
        "    timer = loop_timer if is_async() else thread_timer\n"
        "    if is_async():\n"
        "        await only_on_the_loop()\n"
        "    if is_async() and due:\n"
        "        await renew()\n"
        "    else:\n"
        "        keep()\n"
    )
    out = unasync.unasync(text, "idemctl/aio/attempt.py")
    _same(
        out,
        "import asyncio, time\n"
        "def pause(give_back, backoff: float) -> None:\n"
        "    give_back()\n"
        "    time.sleep(backoff)\n"
        "    if ready():\n"
        "        go()\n"
        "    timer = thread_timer\n"
        "    keep()\n",
    )
    assert "is_async" not in out


def test_docstrings_keep_their_words_renamed_and_strings_their_lines() -> None:
    unasync = _script()
    text = (
        '"""The heartbeat on ``AsyncStore``: ``await hb.stop()``.\n\n'
        'This module is the original of ``idemctl.runner.attempt`` (scripts/unasync.py).\n"""\n'
        "LIMIT = 1\n"
        '"""At most this many on the ``AsyncStore``."""\n'
        "async def f(x: AsyncStore) -> None:\n"
        '    """Wait for ``AsyncStore``; ``async with x`` it."""\n'
        "    log.warning(\n"
        '        "a message written "\n'
        '        f"over two lines {x}"\n'
        "    )\n"
    )
    out = unasync.unasync(text, "idemctl/aio/attempt.py")
    tree = ast.parse(out)
    assert ast.get_docstring(tree) == (
        "The heartbeat on ``Store``: ``hb.stop()``.\n\n"
        "Written by scripts/unasync.py from ``idemctl.aio.attempt``."
    )
    function = tree.body[-1]
    assert isinstance(function, ast.FunctionDef)
    assert ast.get_docstring(function) == "Wait for ``Store``; ``with x`` it."
    assert '"""At most this many on the ``Store``."""' in out
    assert '"a message written "\n' in out  # as written, not one long line


def test_the_sync_modules_in_the_tree_agree_with_their_originals() -> None:
    pytest.importorskip("ruff", reason="the check formats with ruff (the dev extras)")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr


def test_the_check_fails_on_a_sync_module_edited_by_hand(tmp_path: Path) -> None:
    pytest.importorskip("ruff", reason="the check formats with ruff (the dev extras)")
    # A copy of the tree, so the real sync module is never touched.
    shutil.copytree(ROOT / "idemctl", tmp_path / "idemctl")
    shutil.copytree(ROOT / "scripts", tmp_path / "scripts")
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    script = tmp_path / "scripts" / "unasync.py"
    derived = tmp_path / "idemctl" / "runner" / "beat.py"
    derived.write_text(derived.read_text() + "\nEDITED = True\n")
    done = subprocess.run(
        [sys.executable, str(script), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 1
    assert "idemctl/runner/beat.py differs from what idemctl/aio/beat.py gives" in done.stderr
    assert "EDITED" in derived.read_text()  # --check writes nothing
    fixed = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, check=False
    )
    assert fixed.returncode == 0, fixed.stderr
    assert "EDITED" not in derived.read_text()
