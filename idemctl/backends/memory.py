"""``memory://``: one process's store, for tests and the library."""

from idemctl.backends.registry import Backend, register

register(
    Backend(
        "memory",
        ("memory",),
        store="idemctl.stores.memory:MemoryStore",
        in_process=True,
        shared=False,
        scratch="idemctl.harness.rooms:MemoryRoom",
    )
)
