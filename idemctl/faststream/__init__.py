"""FastStream: a Kafka subscriber made effectively-once, the way ``idemctl consume`` runs a
handler: the same key strategies, outcomes, dead letters and fail-closed pauses.

    from faststream import FastStream
    from faststream.kafka import KafkaBroker
    from faststream.middlewares import AckPolicy
    from idemctl.kafka.options import Handling
    from idemctl.faststream import IdempotencyMiddleware
    from idemctl.runner import current_context

    idem = IdempotencyMiddleware("redis://127.0.0.1:6379/0", options=Handling(max_attempts=3))
    broker = KafkaBroker("localhost:9092", middlewares=[idem], ack_policy=AckPolicy.ACK)
    app = FastStream(broker, after_shutdown=[idem.aclose])

    @broker.subscriber("payments", group_id="billing", auto_offset_reset="earliest")
    async def charge(payment: dict) -> dict:
        ctx = current_context()  # key, fencing_token, attempt, takeover
        ...

The middleware owns the subscriber's offsets. A message is committed only once it is
finished: its handler ran and its key completed, or the key was completed before (the stored
result is returned, and published again by the subscriber's publishers), or it went to the
dead-letter topic (acknowledged by the broker), or it was skipped. Anything else pauses its
partition at the message (seek back, pause, resume after a back-off), so it comes again:
a key busy elsewhere, a retriable failure (until ``max_attempts``, counted in the store), a
dead letter the broker refused; an unreachable store pauses every partition of the
consumer (fail closed). Subscribers that commit before their handler runs (FastStream's
default ``AckPolicy.ACK_FIRST``: auto-commit) and batch subscribers are refused on their
first message, which is not committed: the app stops. Subscribers without a ``group_id``
(nothing they finish could be committed) are left alone, with a warning.
"""

from idemctl.faststream.middleware import IdemContext, IdempotencyMiddleware

__all__ = ["IdemContext", "IdempotencyMiddleware"]
