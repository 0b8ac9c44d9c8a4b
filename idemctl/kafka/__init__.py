"""The Kafka rules every Kafka front end of idemctl shares, free of any one client: where a
message's key comes from (``keys``), how a message is handled (``options``, declared with
``flags``), what a run's outcome comes to (``policy``) and what is done about it (``acts``),
and what a dead letter carries (``deadletter``). ``idemctl consume`` (confluent-kafka,
threads), the FastStream middleware (aiokafka, asyncio) and ``idemctl audit`` import them
from here; none of the three imports another."""
