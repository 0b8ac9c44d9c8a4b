"""Each command's module is imported only when that command runs (click's lazy group
pattern): ``idemctl --version``, ``idemctl --help`` and shell completion of the command
names import none of them, and ``idemctl stats`` imports only ``look``.

``COMMANDS`` names every command's module and its summary (the first paragraph of its
docstring, as ``--help`` lists it); tests/cli/test_lazy.py checks both against the commands
themselves, so a command added or reworded without this table fails there.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from idemctl.cli.help import QuietGroup

COMMANDS: dict[str, tuple[str, str]] = {
    "audit": (
        "idemctl.cli.audit",
        "Check a consumer group for messages it committed past and never finished.",
    ),
    "console": (
        "idemctl.cli.console",
        "Serve the web console: the store's keys, entities and actions, in a browser.",
    ),
    "consume": (
        "idemctl.cli.consume",
        "Run a handler for each message of the topics, effectively once per key.",
    ),
    "demo": (
        "idemctl.cli.consume",
        "See effectively-once happen: duplicates, two consumers, one killed mid-run.",
    ),
    "inspect": (
        "idemctl.cli.look",
        "Show every field of KEY's record, or of one ENTITY's with --entity.",
    ),
    "list": (
        "idemctl.cli.look",
        "List records, or the sequence guard's entities, a page at a time.",
    ),
    "stats": (
        "idemctl.cli.look",
        "Count records by status, stale and released leases, the oldest in-progress key's "
        "age, and the sequence guard's entities.",
    ),
    "tasks": (
        "idemctl.cli.tasks",
        "Count the background tasks' keys by queue and task name: in progress, stale, done, "
        "failed.",
    ),
    "doctor": ("idemctl.cli.look", "Check the store and say how to fix what is wrong."),
    "unlock": (
        "idemctl.cli.repair",
        "Free a stuck KEY's lease, or every expired lease with --stale.",
    ),
    "forget": (
        "idemctl.cli.repair",
        "Forget KEY so its next delivery runs the handler again, or an ENTITY with --entity.",
    ),
    "purge": ("idemctl.cli.repair", "Delete records past retention, freeing their space."),
    "init": ("idemctl.cli.provision", "Provision the store; safe to run twice."),
    "verify": (
        "idemctl.cli.verify",
        "Prove effectively-once on your own store and brokers, with numbers.",
    ),
    "version": ("idemctl.cli", "Print idemctl's version."),
    "powertools": (
        "idemctl.cli.powertools",
        "Powertools for AWS Lambda: the key of a payload (operate its tables with --store "
        "URL?layout=powertools).",
    ),
    "outbox": (
        "idemctl.cli.outbox",
        "The transactional outbox: publish its rows to Kafka, replay them, look, purge.",
    ),
}
"""Every command, in the order ``--help`` lists them: its module, its summary."""


def load_all() -> None:
    """Import every command's module (the CLI reference, tests walking every command)."""
    for module, _ in COMMANDS.values():
        import_module(module)


class LazyGroup(QuietGroup):
    """The root group: lists every command of ``COMMANDS`` by its summary, and imports a
    command's module when the command is resolved to run (or to complete its options).
    ``app``: the typer app the commands' modules register on (``idemctl.cli.common`` sets
    it where it makes the app, so this module imports nothing of the CLI's)."""

    app: Any = None

    def list_commands(self, ctx: Any) -> list[str]:
        return list(dict.fromkeys([*COMMANDS, *super().list_commands(ctx)]))

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        found = super().get_command(ctx, cmd_name)
        if found is not None or cmd_name not in COMMANDS:
            return found
        from typer.core import TyperCommand

        # What a listing (--help, completion of the names) needs: the name and summary.
        return TyperCommand(cmd_name, help=COMMANDS[cmd_name][1])

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        if args and args[0] in COMMANDS and args[0] not in self.commands:
            self.add_command(_built(self.app, args[0]), args[0])
        return super().resolve_command(ctx, args)


def _built(app: Any, name: str) -> Any:
    """The click command of ``name``, its module imported (registering it on ``app``)."""
    import typer.main

    import_module(COMMANDS[name][0])
    return typer.main.get_command(app).commands[name]  # type: ignore[attr-defined]
