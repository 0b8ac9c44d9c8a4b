"""Store URLs: printed without passwords; options parsed strictly, typos reported."""

from __future__ import annotations

import pytest

from idemctl.errors import ConfigError
from idemctl.urls import UrlOptions, redact_text, redact_url, secrets_in

# redact_url ------------------------------------------------------------------------------


def test_redact_url_hides_the_password_and_keeps_the_rest() -> None:
    redacted = redact_url("redis://user:s3cret@host:6379/0")
    assert "s3cret" not in redacted
    assert redacted == "redis://user:***@host:6379/0"


def test_redact_url_hides_a_password_without_a_user() -> None:
    redacted = redact_url("postgresql://:pw@h/db")
    assert "pw@" not in redacted
    assert "***" in redacted
    assert redacted.endswith("@h/db")


def test_redact_url_hides_a_password_that_contains_an_at_sign() -> None:
    redacted = redact_url("redis://user:p@ss@host/0")
    assert "p@ss" not in redacted
    assert redacted == "redis://user:***@host/0"


def test_redact_url_keeps_the_query_string() -> None:
    assert redact_url("rediss://u:pw@h:6380/1?timeout=5s") == "rediss://u:***@h:6380/1?timeout=5s"


@pytest.mark.parametrize(
    "url",
    [
        "memory://",
        "sqlite:///./idemctl.db",
        "sqlite:////var/lib/idemctl.db",
        "redis://user@host:6379/0",
        "redis://host:6379/0",
        "dynamodb://table?region=eu-west-1",
    ],
)
def test_redact_url_leaves_urls_without_password_unchanged(url: str) -> None:
    assert redact_url(url) == url


@pytest.mark.parametrize(
    "url",
    [
        "redis://user:s3cret@[::1/0",
        "redis:/user:s3cret@host:6379/0",
        "user:s3cret@host",
        "redis://user:s3#cret@host:6379/0",  # urlsplit would end the password at "#"
        "redis://user:s3?cret@host/0",
        "postgresql://user:s3/cret@host/db",
    ],
)
def test_redact_url_of_malformed_url_still_hides_the_password(url: str) -> None:
    shown = redact_url(url)
    assert "s3cret" not in shown
    assert "user:***@" in shown


def test_redact_url_hides_a_password_given_as_query_option() -> None:
    assert "s3cret" not in redact_url("postgresql://user@h/db?password=s3cret")


# UrlOptions ------------------------------------------------------------------------------


def test_unknown_option_is_named_and_the_password_is_not_shown() -> None:
    options = UrlOptions("redis://user:s3cret@host/0?leese=5s&timeout=1s")
    assert options.duration("timeout", 10.0) == 1.0
    with pytest.raises(ConfigError) as info:
        options.finish()
    message = str(info.value)
    assert "leese" in message
    assert (
        "timeout" not in message.split(" in ", maxsplit=1)[0]
    )  # consumed options are not reported
    assert "s3cret" not in message
    assert "***" in message


def test_all_unknown_options_are_reported_together() -> None:
    with pytest.raises(ConfigError, match="alpha, beta"):
        UrlOptions("memory://?beta=1&alpha=2").finish()


def test_finish_passes_when_every_option_was_consumed() -> None:
    options = UrlOptions("memory://?lease=5s")
    options.duration("lease", 30.0)
    options.finish()  # must not raise
    assert options.duration("lease", 30.0) == 30.0  # consumed: the default again


def test_unparseable_url_is_a_config_error_without_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        UrlOptions("redis://user:s3cret@[::1/0")
    assert "s3cret" not in str(info.value)


def test_text_option_and_its_default() -> None:
    options = UrlOptions("dynamodb://table?region=eu-west-1")
    assert options.text("region") == "eu-west-1"
    assert options.text("endpoint_url") is None
    assert options.text("profile", "default") == "default"


@pytest.mark.parametrize(("raw", "seconds"), [("250ms", 0.25), ("5m", 300.0), ("12", 12.0)])
def test_duration_option(raw: str, seconds: float) -> None:
    assert UrlOptions(f"memory://?lease={raw}").duration("lease", 30.0) == seconds


def test_duration_option_default_when_absent() -> None:
    assert UrlOptions("memory://").duration("lease", 30.0) == 30.0


@pytest.mark.parametrize("raw", ["5x", "", "-1s"])
def test_bad_duration_option_is_a_config_error_naming_the_option(raw: str) -> None:
    with pytest.raises(ConfigError, match="store URL option lease"):
        UrlOptions(f"memory://?lease={raw}").duration("lease", 30.0)


def test_bad_duration_message_never_shows_the_password() -> None:
    with pytest.raises(ConfigError) as info:
        UrlOptions("redis://u:s3cret@h/0?lease=soon").duration("lease", 30.0)
    assert "s3cret" not in str(info.value)


@pytest.mark.parametrize("raw", ["1", "true", "TRUE", "yes", "on"])
def test_flag_option_true(raw: str) -> None:
    assert UrlOptions(f"memory://?auto_provision={raw}").flag("auto_provision", False) is True


@pytest.mark.parametrize("raw", ["0", "false", "False", "no", "off"])
def test_flag_option_false(raw: str) -> None:
    assert UrlOptions(f"memory://?auto_provision={raw}").flag("auto_provision", True) is False


def test_flag_option_default_when_absent() -> None:
    assert UrlOptions("memory://").flag("auto_provision", True) is True


@pytest.mark.parametrize("raw", ["maybe", "2", ""])
def test_bad_flag_option_is_a_config_error(raw: str) -> None:
    with pytest.raises(ConfigError, match=r"auto_provision.*use 1 or 0"):
        UrlOptions(f"memory://?auto_provision={raw}").flag("auto_provision", True)


def test_choice_option_is_case_insensitive() -> None:
    options = UrlOptions("sqlite:///x.db?synchronous=NORMAL")
    assert options.choice("synchronous", ("full", "normal", "extra"), "full") == "normal"


def test_choice_option_default_when_absent() -> None:
    assert UrlOptions("sqlite:///x.db").choice("synchronous", ("full", "normal"), "full") == "full"


def test_bad_choice_option_lists_the_choices() -> None:
    with pytest.raises(ConfigError) as info:
        UrlOptions("sqlite:///x.db?synchronous=off").choice(
            "synchronous", ("full", "normal", "extra"), "full"
        )
    message = str(info.value)
    assert "synchronous='off'" in message
    assert "full, normal, extra" in message


@pytest.mark.parametrize(
    ("url", "secrets"),
    [
        ("redis://:pa#ss@127.0.0.1:1/0", ["pa#ss"]),
        ("postgresql://u:p%40ss@h/db?password=zz", ["p%40ss", "p@ss", "zz"]),
        ("app:s3cret@127.0.0.1/x", ["s3cret"]),
        ("redis://h:6379/0", []),
        ("sqlite:///./x.db", []),
    ],
)
def test_secrets_in_finds_every_form_of_the_password(url: str, secrets: list[str]) -> None:
    found = secrets_in(url)
    assert sorted(found) == sorted(secrets)
    assert all(s not in redact_text(f"log line about {url}", found) for s in secrets)


def test_whole_number_options_take_defaults_and_refuse_what_is_not_one() -> None:
    options = UrlOptions("memory://?pool_max=4&replicas=&workers=2")
    assert options.whole("pool_max", 8, minimum=1) == 4
    assert options.whole("replicas", 0) == 0  # blank: the default
    assert options.whole("absent", 3) == 3
    with pytest.raises(ConfigError, match=r"workers='2': use a whole number, at least 3"):
        options.whole("workers", 5, minimum=3)
    for bad in ("-1", "1.5", "two"):
        with pytest.raises(ConfigError, match=rf"n={bad!r}: use a whole number$"):
            UrlOptions(f"memory://?n={bad}").whole("n", 1)
