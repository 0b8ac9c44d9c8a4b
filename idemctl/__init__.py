"""idemctl: effectively-once processing for Kafka consumers.

    from idemctl import open_store, idempotent

    store = open_store("sqlite:///./idemctl.db")

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str, amount_cents: int) -> dict: ...

For asyncio, ``idemctl.aio`` has the same API with coroutines (``aio.open_store``,
``await aio.run``, ``@aio.idempotent`` on ``async def``).

Importing idemctl loads no store driver: each backend is imported on first use.
"""

from idemctl.errors import (
    ConfigError,
    FingerprintMismatch,
    HandlerTimeout,
    IdemctlError,
    InvalidCursor,
    InvalidKey,
    InvalidPayload,
    KeyBusy,
    KeyNotFound,
    LeaseLost,
    MissingDriver,
    NotProvisioned,
    Permanent,
    PreviouslyFailed,
    ProcessingError,
    Refused,
    StaleEvent,
    StoreError,
    StoreUnavailable,
)
from idemctl.model import (
    Acquired,
    Busy,
    ClaimOutcome,
    ClaimRequest,
    Completed,
    Completion,
    Failed,
    Mismatch,
    Order,
    Record,
    Status,
    fingerprint,
)
from idemctl.runner import Context, Outcome, RunResult, current_context, idempotent, run
from idemctl.stores import open_store
from idemctl.stores.base import Store

__version__ = "0.1.0"

__all__ = [
    "Acquired",
    "Busy",
    "ClaimOutcome",
    "ClaimRequest",
    "Completed",
    "Completion",
    "ConfigError",
    "Context",
    "Failed",
    "FingerprintMismatch",
    "HandlerTimeout",
    "IdemctlError",
    "InvalidCursor",
    "InvalidKey",
    "InvalidPayload",
    "KeyBusy",
    "KeyNotFound",
    "LeaseLost",
    "Mismatch",
    "MissingDriver",
    "NotProvisioned",
    "Order",
    "Outcome",
    "Permanent",
    "PreviouslyFailed",
    "ProcessingError",
    "Record",
    "Refused",
    "RunResult",
    "StaleEvent",
    "Status",
    "Store",
    "StoreError",
    "StoreUnavailable",
    "__version__",
    "current_context",
    "fingerprint",
    "idempotent",
    "open_store",
    "run",
]
