"""scripts/unasync.py: what it makes of async code, and that the sync modules in the tree
are what their async originals give (the same check scripts/test runs)."""

from __future__ import annotations

import importlib.util
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


def test_async_syntax_and_names_become_their_sync_forms() -> None:
    unasync = _script()
    original = "idemctl/aio/attempt.py"
    text = (
        "from idemctl.stores.base_async import AsyncStore\n"
        "async def run(store: AsyncStore) -> None:\n"
        "    async with store.transaction('k') as unit:\n"
        "        await unit.complete()\n"
        "    await asyncio.shield(give_back(store))\n"
        "    AsyncStorefront = 1\n"
    )
    out = unasync.unasync(text, original)
    body = out.split("\n", 2)[2]  # past the two lines that say where it comes from
    assert body == (
        "from idemctl.stores.base import Store\n"
        "def run(store: Store) -> None:\n"
        "    with store.transaction('k') as unit:\n"
        "        unit.complete()\n"
        "    give_back(store)\n"
        "    AsyncStorefront = 1\n"
    )
    assert "Do not edit" in out.split("\n", 2)[1]
    assert original in out.split("\n", 1)[0]


def test_the_sync_modules_in_the_tree_agree_with_their_originals() -> None:
    pytest.importorskip("ruff", reason="the check formats with ruff (the dev extras)")
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"], capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
