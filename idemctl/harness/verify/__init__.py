"""``idemctl verify``: effectively-once proven on the user's own store and brokers.

It makes a scratch topic (and its dead-letter topic) and a scratch namespace of the store
(``harness.scratch``), produces messages with duplicates (some in other partitions) and
planted poison messages, runs ``idemctl consume`` processes with the recording handler
(``harness.recorder``), and while they run SIGKILLs and restarts them, lets consumers join
and leave, and pauses the store, as asked. When every message is committed it stops them,
reads the ledger and the dead-letter topic, and judges:

- **lost**: a key with no effect although its messages were committed;
- **duplicate effects**: effects beyond the first of a key. In transactional mode
  (PostgreSQL, the ledger row in the key's transaction) none are allowed. Otherwise an
  effect may repeat only when its consumer was SIGKILLed after it and before its key was
  completed, at most what ``idemctl consume`` promises a kill can repeat (the handler
  running and the completions not acknowledged yet: ``repeats_per_kill``), or when a
  store fault kept it from being completed;
- **dead letters**: exactly the planted poison keys in the dead-letter topic.

Everything it made is removed at the end, also on Ctrl-C, unless ``keep``. No printing here:
``on_step`` hears what happens and ``on_progress`` gets a ``Progress``; the CLI renders.
"""

from idemctl.harness.verify.plan import Plan, Progress, VerifyReport
from idemctl.harness.verify.run import run_verify

__all__ = ["Plan", "Progress", "VerifyReport", "run_verify"]
