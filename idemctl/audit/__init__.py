"""``idemctl audit``: check a live consumer group for work it passed and never finished.

The group's committed offsets say which messages it is done with; each message's key
record in the store says what became of it. A message below the committed offset whose key
never completed (and was not dead-lettered) is lost: the group will not read it again.
See ``judge`` for the classes. Kafka is read with ``assign`` only: the group's offsets and
members are left as they are.
"""

from idemctl.audit.judge import Judge, Judgement, Seen
from idemctl.audit.model import (
    CLASSES,
    FAIL_ON,
    LOST_SHOWN,
    AuditOptions,
    AuditReport,
    Doubt,
    LostMessage,
    PartitionAudit,
)
from idemctl.audit.run import AuditProgress, audit

__all__ = [
    "CLASSES",
    "FAIL_ON",
    "LOST_SHOWN",
    "AuditOptions",
    "AuditProgress",
    "AuditReport",
    "Doubt",
    "Judge",
    "Judgement",
    "LostMessage",
    "PartitionAudit",
    "Seen",
    "audit",
]
