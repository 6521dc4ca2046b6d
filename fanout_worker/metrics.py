"""Prometheus metrics of the fan-out worker process (write metrics live in timeline.metrics)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge

MESSAGES = Counter("fanout_messages_total", "Fan-out messages handled", ["type", "outcome"])
POISONED = Counter("fanout_poisoned_total", "Messages moved to the poison queue", ["reason"])
IN_FLIGHT = Gauge("fanout_in_flight_messages", "Messages being worked on")
QUEUE_DEPTH = Gauge("fanout_queue_depth", "Approximate messages in a queue", ["queue"])
