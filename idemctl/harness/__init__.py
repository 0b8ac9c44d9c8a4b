"""Processes idemctl starts around itself: a local Kafka-protocol broker (``broker``), and
``idemctl demo``'s run of producers, consumers and a kill (``demo``).

Not part of the library's API, and not imported by ``import idemctl``: the CLI, the tests
and the benchmarks import the module they need.
"""
