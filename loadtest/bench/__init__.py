"""``make bench``: the fan-out worker against the raw storage ceiling, measured in one run.

Every phase starts fresh in-memory Azurites and fresh ``fanout-worker`` processes, seeds
what it needs through the SDK, and reads the workers' own Prometheus counters and CPU time.
``python -m loadtest.bench`` prints one JSON object as its last line; see loadtest/README.md
for the method. ``harness`` is shared (also by ``loadtest.run`` and ``loadtest.seed``); each
other module is one phase.
"""
