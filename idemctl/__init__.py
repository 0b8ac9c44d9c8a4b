"""idemctl: effectively-once processing for Kafka consumers.

    from idemctl import open_store, idempotent

    store = open_store("sqlite:///./idemctl.db")

    @idempotent(store, key="charge:{order_id}")
    def charge(order_id: str, amount_cents: int) -> dict: ...

For asyncio, ``idemctl.aio`` has the same API with coroutines (``aio.open_store``,
``await aio.run``, ``@aio.idempotent`` on ``async def``).

Importing idemctl loads no store driver: each backend is imported on first use.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
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
        StaleFence,
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

_EXPORTS: dict[str, str] = {
    "Acquired": "idemctl.model",
    "Busy": "idemctl.model",
    "ClaimOutcome": "idemctl.model",
    "ClaimRequest": "idemctl.model",
    "Completed": "idemctl.model",
    "Completion": "idemctl.model",
    "ConfigError": "idemctl.errors",
    "Context": "idemctl.runner",
    "Failed": "idemctl.model",
    "FingerprintMismatch": "idemctl.errors",
    "HandlerTimeout": "idemctl.errors",
    "IdemctlError": "idemctl.errors",
    "InvalidCursor": "idemctl.errors",
    "InvalidKey": "idemctl.errors",
    "InvalidPayload": "idemctl.errors",
    "KeyBusy": "idemctl.errors",
    "KeyNotFound": "idemctl.errors",
    "LeaseLost": "idemctl.errors",
    "Mismatch": "idemctl.model",
    "MissingDriver": "idemctl.errors",
    "NotProvisioned": "idemctl.errors",
    "Order": "idemctl.model",
    "Outcome": "idemctl.runner",
    "Permanent": "idemctl.errors",
    "PreviouslyFailed": "idemctl.errors",
    "ProcessingError": "idemctl.errors",
    "Record": "idemctl.model",
    "Refused": "idemctl.errors",
    "RunResult": "idemctl.runner",
    "StaleEvent": "idemctl.errors",
    "StaleFence": "idemctl.errors",
    "Status": "idemctl.model",
    "Store": "idemctl.stores.base",
    "StoreError": "idemctl.errors",
    "StoreUnavailable": "idemctl.errors",
    "current_context": "idemctl.runner",
    "fingerprint": "idemctl.model",
    "idempotent": "idemctl.runner",
    "open_store": "idemctl.stores",
    "run": "idemctl.runner",
}
"""Each public name and the module it lives in: imported on first use (PEP 562), so that
``import idemctl`` (and the CLI's start, which imports it) costs next to nothing."""

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
    "StaleFence",
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


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'idemctl' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # once: the next lookup finds it without this hook
    return value


def __dir__() -> list[str]:
    return sorted(__all__)
