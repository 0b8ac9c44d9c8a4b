"""``sqlite:///PATH``: the embedded default."""

from idemctl.backends.registry import Backend, register

register(
    Backend(
        "sqlite",
        ("sqlite",),
        store="idemctl.stores.sqlite:SQLiteStore",
        in_process=True,
        scratch="idemctl.harness.rooms:SQLiteRoom",
    )
)
