"""Consume's options are declared once, in the library's dataclasses: the command line,
``ConsumeOptions``, the FastStream middleware's ``Handling`` and ``--processes``' workers'
command line all come from that declaration."""

from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from enum import Enum
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from idemctl.cli import app
from idemctl.cli.consume import HELP_ORDER
from idemctl.cli.declared import Given, declared
from idemctl.cli.workers import worker_args
from idemctl.consume.options import ConsumeOptions
from idemctl.errors import ConfigError
from idemctl.kafka.flags import FIELD_DEFAULT, flag_name, flags, option
from idemctl.kafka.options import Handling, Keyed
from tests.consume.test_workers import consume_context


def consume_params() -> dict[str, Any]:
    """The consume command's parameters, but the global options every command takes."""
    from idemctl.cli.consume import consume

    command: Any = typer.main.get_command(app)
    own = inspect.signature(consume).parameters
    return {p.name: p for p in command.commands["consume"].params if p.name in own}


def test_every_declared_option_is_a_consume_option_with_its_flag_help_and_default() -> None:
    params = consume_params()
    for field, flag in flags(ConsumeOptions):
        param = params[field.name]
        assert max(param.opts, key=len) == flag_name(field, flag)
        assert param.help == flag.help
        if field.default is dataclasses.MISSING:
            assert param.required, field.name
            continue
        shown = param.default.value if isinstance(param.default, Enum) else param.default
        assert shown == (field.default if flag.given is FIELD_DEFAULT else flag.given)
    # What the command adds of its own is only what ConsumeOptions does not hold.
    own = set(params) - {f.name for f, _ in flags(ConsumeOptions)}
    assert own == {"handler", "brokers", "kafka_config", "metrics_port", "metrics_host",
                   "log_format", "processes", "worker_index"}  # fmt: skip


def test_the_options_given_become_the_dataclass_values_and_the_workers_command_line() -> None:
    ctx = consume_context(
        "--topic", "a", "--group", "g", "--handler", "m:f", "--lease", "2m",
        "--exit-when-idle", "1s", "--trace-keys", "raw", "--permanent-errors", "KeyError",
        "--processes", "2",
    )  # fmt: skip
    given = Given(list(flags(ConsumeOptions)), {f.name: ctx.params[f.name] for f, _ in
                                                flags(ConsumeOptions)})  # fmt: skip
    options = ConsumeOptions(brokers="b", **given.values())
    assert (options.lease, options.exit_when_idle, options.trace_keys) == (120.0, 1.0, "raw")
    assert options.permanent_errors == (KeyError,)
    assert options.gap_timeout == 30.0 and options.handler_timeout == 300.0  # "30s", "5m"
    assert worker_args(ctx) == [
        "--handler", "m:f", "--topic", "a", "--group", "g", "--trace-keys", "raw",
        "--lease", "2m", "--exit-when-idle", "1s", "--permanent-errors", "KeyError",
    ]  # fmt: skip


def test_a_bad_value_is_the_dataclass_s_own_error_naming_the_flag() -> None:
    done = CliRunner().invoke(
        app, ["consume", "--topic", "t", "--group", "g", "--handler", "m:f", "--lease", "soon"]
    )
    assert done.exit_code == 2
    assert "--lease" in done.output
    with pytest.raises(ConfigError, match="--on-stale 'later': use skip or dlq"):
        Handling(on_stale="later")


def test_handling_and_audit_s_keying_are_parts_of_the_one_declaration() -> None:
    names = {f.name for f, _ in flags(ConsumeOptions)}
    assert {f.name for f, _ in flags(Handling)} <= names
    assert {f.name for f, _ in flags(Keyed)} == {"key", "on_missing_key", "order_key", "sequence"}
    from idemctl.audit import AuditOptions
    from idemctl.faststream import IdempotencyMiddleware

    assert issubclass(AuditOptions, Keyed) and issubclass(ConsumeOptions, Handling)
    assert inspect.signature(IdempotencyMiddleware).parameters["options"].annotation in (
        "Handling | None",
        Handling | None,
    )
    assert set(HELP_ORDER) == set(consume_params())


@dataclass(kw_only=True)
class Fake:
    colour: str = option("red", metavar="NAME", help="The colour")
    wait: float = option(2.0, kind="duration", given="2s", metavar="DUR", help="How long")


def test_a_new_option_joins_the_command_through_its_declaration_alone() -> None:
    seen: list[Fake] = []
    fake = typer.Typer(add_completion=False)

    @fake.command()
    @declared(Fake, ("name", "colour", "wait"))
    def paint(ctx: typer.Context, name: str, declared: Given) -> None:
        seen.append(Fake(**declared.values()))

    params: dict[str, Any] = {p.name: p for p in typer.main.get_command(fake).params}
    assert list(params) == ["name", "colour", "wait"]
    assert (params["colour"].opts, params["colour"].metavar) == (["--colour"], "NAME")
    assert (params["wait"].opts, params["wait"].default, params["wait"].help) == (
        ["--wait"], "2s", "How long",
    )  # fmt: skip
    done = CliRunner().invoke(fake, ["door", "--wait", "1m"])
    assert done.exit_code == 0, done.output
    assert seen == [Fake(colour="red", wait=60.0)]


def test_a_help_order_that_leaves_an_option_out_is_refused_at_once() -> None:
    with pytest.raises(AssertionError, match="help order"):

        @declared(Fake, ("colour",))
        def paint(ctx: typer.Context, declared: Given) -> None: ...
