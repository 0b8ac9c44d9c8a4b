"""``import idemctl`` stays light: no store driver, Kafka client, CLI framework, metrics or
tracing library loads."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HEAVY = [
    "redis",
    "psycopg",
    "psycopg_pool",
    "boto3",
    "botocore",
    "confluent_kafka",
    "typer",
    "rich",
    "prometheus_client",
    "opentelemetry",
    "faststream",
    "aiokafka",
]


def loaded_after(code: str) -> list[str]:
    script = (
        f"import sys\n{code}\n"
        "import json\n"
        f"heavy = {HEAVY!r}\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


def test_import_idemctl_loads_no_driver_and_no_cli() -> None:
    assert loaded_after("import idemctl") == []


def test_public_api_names_load_no_driver() -> None:
    assert loaded_after("from idemctl import *") == []


def test_opening_memory_and_sqlite_stores_loads_no_driver(tmp_path: Path) -> None:
    code = (
        "import idemctl\n"
        "idemctl.open_store('memory://').claim('k')\n"
        f"idemctl.open_store('sqlite:///{tmp_path}/x.db').claim('k')\n"
    )
    assert loaded_after(code) == []


def test_the_async_api_loads_no_driver_until_a_store_needs_one(tmp_path: Path) -> None:
    code = (
        "import asyncio\n"
        "from idemctl import aio\n"
        "async def main():\n"
        "    async with aio.open_store('memory://') as store:\n"
        "        await aio.run(store, 'k', lambda ctx: 1)\n"
        f"    async with aio.open_store('sqlite:///{tmp_path}/x.db') as store:\n"
        "        await aio.run(store, 'k', lambda ctx: 1)\n"
        "asyncio.run(main())\n"
    )
    assert loaded_after(code) == []
