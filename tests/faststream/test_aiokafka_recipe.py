"""The manual's aiokafka recipe (docs/guides/aiokafka.md: ``idemctl.aio`` in a loop of your
own) runs as written against the real broker: duplicates charged once, a message without a
key dead-lettered, every offset committed."""

from __future__ import annotations

import asyncio
import os
import re
from collections import Counter
from pathlib import Path
from typing import Any

from tests.consume.test_consume import REPO, committed, names, produce, read_all
from tests.polling import wait_until_async
from tests.servers import KafkaBroker

HEADING = "# aiokafka: `idemctl.aio` in your own loop\n"
PAGE = Path(os.environ.get("IDEMCTL_RECIPE_PAGE", REPO / "docs" / "guides" / "aiokafka.md"))
"""The page to read the recipe from (another file's for a draft of it)."""


def recipe() -> str:
    text = PAGE.read_text()
    assert HEADING in text, f"{PAGE} has no section {HEADING.strip()!r}"
    match = re.search(r"```python\n(.*?)```", text.split(HEADING, 1)[1], re.S)
    assert match, f"no python block under {HEADING.strip()!r}"
    return match.group(1)


def test_aiokafka_recipe_charges_once_and_commits_to_the_end(
    kafka_broker: KafkaBroker, tmp_path: Path
) -> None:
    namespace: dict[str, Any] = {}
    exec(compile(recipe(), str(PAGE), "exec"), namespace)
    topic, group = names()
    kafka_broker.create_topic(topic, partitions=2)
    keys = [f"pay-{i}" for i in range(20)]
    messages = [{"value": {"n": i}, "idem": k, "kkey": k.encode()} for i, k in enumerate(keys)]
    messages += messages[:8]  # duplicates
    messages.append({"value": {"n": -1}, "idem": None, "kkey": b"keyless"})
    produce(kafka_broker, topic, messages)

    async def main() -> None:
        consuming = asyncio.create_task(
            namespace["consume"](
                kafka_broker.bootstrap, topic, group, f"sqlite:///{tmp_path}/keys.db"
            )
        )

        async def all_committed() -> bool:
            assert not consuming.done(), consuming
            offsets = await asyncio.to_thread(committed, kafka_broker, topic, group, 2)
            return sum(max(o, 0) for o in offsets.values()) >= len(messages)

        await wait_until_async(all_committed, "every offset committed", 90, 0.1)
        consuming.cancel()
        await asyncio.gather(consuming, return_exceptions=True)

    asyncio.run(main())
    assert Counter(namespace["charges"]) == Counter(keys)  # once each
    (dead,) = read_all(kafka_broker, f"{topic}.dlq", expect=1)
    assert dict(dead.headers())["idemctl-dlt-reason"] == b"no usable idempotency key"
    assert dead.key() == b"keyless"
