"""Prometheus metrics of the fan-out worker process (write metrics live in timeline.metrics).

They go in ``timeline.metrics.FANOUT`` with the library's fan-out series, not in the default
registry that the API serves too.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from timeline.metrics import FANOUT, STORAGE_LIMIT, STORAGE_WAITING
from timeline.model.priority import Priority
from timeline.storage.limiter import AdaptiveLimiter

MESSAGES = Counter(
    "fanout_messages_total", "Fan-out messages handled", ["type", "outcome"], registry=FANOUT
)
POISONED = Counter(
    "fanout_poisoned_total", "Messages moved to the poison queue", ["reason"], registry=FANOUT
)
IN_FLIGHT = Gauge("fanout_in_flight_messages", "Messages being worked on", registry=FANOUT)
QUEUE_DEPTH = Gauge(
    "fanout_queue_depth", "Approximate messages in a queue", ["queue"], registry=FANOUT
)


def worker_registry() -> CollectorRegistry:
    """What a worker's metrics endpoint serves: every process's series (the default
    registry's, process and storage ones included) and the fan-out's."""
    served = CollectorRegistry()
    served.register(REGISTRY)
    served.register(FANOUT)
    return served


def watch_limiter(limiter: AdaptiveLimiter) -> None:
    """Serve the limiter's state as gauges, read when scraped."""
    STORAGE_LIMIT.set_function(lambda: limiter.limit)
    for level in Priority:
        STORAGE_WAITING.labels(level.name.lower()).set_function(_waiting(limiter, level))


def _waiting(limiter: AdaptiveLimiter, level: Priority) -> Callable[[], float]:
    return lambda: limiter.waiting(level)
