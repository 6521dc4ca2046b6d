"""Prometheus metrics of the fan-out worker process (write metrics live in timeline.metrics).

They go in ``timeline.metrics.FANOUT`` with the library's fan-out series, not in the default
registry that the API serves too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from timeline.metrics import FANOUT, STORAGE_LIMIT, STORAGE_WAITING
from timeline.model.priority import Priority
from timeline.storage.flow.limiter import AdaptiveLimiter
from timeline.storage.names import poison_queue_name
from timeline.storage.queue import FanoutQueue

log = logging.getLogger(__name__)

MESSAGES = Counter(
    "fanout_messages_total", "Fan-out messages handled", ["type", "outcome"], registry=FANOUT
)
POISONED = Counter(
    "fanout_poisoned_total", "Messages moved to the poison queue", ["reason"], registry=FANOUT
)
IN_FLIGHT = Gauge("fanout_in_flight_messages", "Messages being worked on", registry=FANOUT)
OLDEST_DUE = Gauge(
    "fanout_expiry_oldest_due_seconds",
    "How long past its due time the oldest index row the last expiry sweep found was (by "
    "its bucket, before the grace), by group: d (keys, windows, mutes), "
    "a (dormancy checks; not swept while inactive readers are off)",
    ["group"],
    registry=FANOUT,
)
RECEIVES = Counter(
    "fanout_receives_total",
    "Queue receive requests that returned, by result: empty or leased (at least one message)",
    ["result"],
    registry=FANOUT,
)
RECEIVERS_WOKEN = Counter(
    "fanout_receivers_woken_total",
    "Idle receivers woken early because another receiver of the process leased messages",
    registry=FANOUT,
)
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


async def sample_depth(shards: list[FanoutQueue]) -> None:
    """Sample every lane's and poison queue's depth every few seconds, until cancelled."""
    while True:
        try:
            for queue in shards:
                for lane in queue.lanes:
                    QUEUE_DEPTH.labels(lane.name).set(await lane.depth())
                poison = await queue.poison_depth()
                QUEUE_DEPTH.labels(poison_queue_name(queue.shard)).set(poison)
        except Exception:  # a sampler must never die
            log.warning("could not sample queue depths", exc_info=True)
        await asyncio.sleep(5)
