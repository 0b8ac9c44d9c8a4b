"""The wheel carries lua/ and schemas/, and an installed wheel finds them as a checkout does."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def shipped(folder: str) -> list[str]:
    return sorted(
        str(p.relative_to(REPO))
        for p in (REPO / folder).rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    )


@pytest.mark.slow
def test_wheel_lists_every_lua_and_schema_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = shipped("lua") + shipped("schemas")
    assert "schemas/sqlite.sql" in expected and "schemas/record.schema.json" in expected
    missing = [f for f in expected if f"idemctl/{f}" not in names]
    assert missing == []
    assert "idemctl/py.typed" in names
    assert any(n.endswith("entry_points.txt") for n in names)


@pytest.mark.slow
def test_installed_wheel_finds_its_resources(wheel: Path, tmp_path: Path) -> None:
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--target",
            str(target),
            str(wheel),
        ],
        check=True,
    )
    probe = (
        "import idemctl, idemctl.resources as r;"
        "print(idemctl.__file__);"
        "print(r.resource_dir('schemas'));"
        "print(r.resource_dir('lua'));"
        "print(len(r.read_resource('schemas', 'sqlite.sql')))"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    out = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    module, schemas, lua, size = out
    assert module.startswith(str(target))
    assert schemas == str(target / "idemctl" / "schemas")
    assert lua == str(target / "idemctl" / "lua")
    assert int(size) > 100


def test_checkout_finds_the_top_level_folders() -> None:
    from idemctl.resources import read_resource, resource_dir

    assert Path(str(resource_dir("schemas"))) == REPO / "schemas"
    assert Path(str(resource_dir("lua"))) == REPO / "lua"
    assert "CREATE TABLE" in read_resource("schemas", "sqlite.sql")
