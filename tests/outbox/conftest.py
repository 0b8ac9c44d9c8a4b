"""The outbox tests' fixtures: ``pg``, a provisioned store in a schema of the test's own
(defined in test_outbox.py, which, like test_relay_order.py, uses its own copy)."""

from tests.outbox.test_outbox import pg  # noqa: F401 - a fixture, found by pytest here
