"""Prometheus metrics of the core library (storage and fan-out); shells add their own.

Two registries, by process role. The default registry holds what every process updates
(storage calls, messages queued), and it is what the API serves. ``FANOUT`` holds the
fan-out's own series: the library defines them (the writer and the trims update them), and
every process imports them (the settings import the fan-out), but only a worker serves them
(``fanout_worker.metrics.worker_registry``), so an API's ``/metrics`` never lists them at 0.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

FANOUT = CollectorRegistry()
"""The fan-out worker's series, served by the worker only."""

MESSAGES_SENT = Counter("timeline_messages_sent_total", "Fan-out messages queued", ["type"])

STORAGE_REQUESTS = Counter(
    "timeline_storage_requests_total", "Storage calls made (one per guarded call)"
)
RELATION_CHECKS = Counter(
    "timeline_relation_checks_total",
    "Queries that loaded a reader's blocks and mutes for a home page (timeline.reads.hidden)",
)
STORAGE_UNAVAILABLE = Counter(
    "timeline_storage_unavailable_total",
    "Storage calls that timed out, were throttled or could not connect",
)
STORAGE_LIMIT = Gauge(
    "fanout_storage_limit",
    "Table requests the worker's adaptive limiter lets be in flight",
    registry=FANOUT,
)
STORAGE_WAITING = Gauge(
    "fanout_storage_waiting",
    "Table requests waiting for a place in the worker's adaptive limiter",
    ["priority"],
    registry=FANOUT,
)
COUNTER_CONFLICTS = Counter(
    "timeline_counter_conflicts_total",
    "Counter-shard writes lost to a concurrent writer and retried on another shard",
)
DELIVERIES = Counter(
    "fanout_deliveries_total", "Timeline entities written by the fan-out", registry=FANOUT
)
REPOST_DEDUPE_REQUESTS = Counter(
    "timeline_repost_dedupe_requests_total",
    "Timeline queries a repost's delivery made to find the post among a reader's newest entries",
    registry=FANOUT,
)
REPOST_DEDUPED = Counter(
    "timeline_repost_deduped_total",
    "Repost copies not written: the reader's newest entries already show the post",
    registry=FANOUT,
)
REPLY_FOLLOW_CHECKS = Counter(
    "timeline_reply_follow_checks_total",
    "Queries a reply's delivery made of the replied-to author's followers (one per page)",
    registry=FANOUT,
)
INACTIVE_SKIPPED = Counter(
    "timeline_inactive_skipped_total",
    "Post deliveries skipped because the follower is dormant (timeline.tables.activity)",
    registry=FANOUT,
)
REMOVALS = Counter(
    "fanout_removals_total", "Timeline entities deleted by the fan-out", registry=FANOUT
)
WRITE_REQUESTS = Counter(
    "fanout_write_requests_total",
    "Timeline write requests (EGT batches and single writes)",
    registry=FANOUT,
)
BATCH_SIZE = Histogram(
    "fanout_batch_size",
    "Operations per timeline write request",
    buckets=(1, 2, 5, 10, 20, 50, 99, 100),
    registry=FANOUT,
)
LAG = Histogram(
    "fanout_delivery_lag_seconds",
    "Post created to delivered into a follower's timeline",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60),
    registry=FANOUT,
)
WRITE_RETRIES = Counter(
    "fanout_write_retries_total", "Timeline write requests retried", registry=FANOUT
)
WRITES_EXPIRED = Counter(
    "fanout_writes_expired_total",
    "Timeline upserts dropped because their reason was too old",
    registry=FANOUT,
)
TRIM_REQUESTS = Counter(
    "fanout_trim_requests_total",
    "Storage requests made to trim timelines to the cap",
    registry=FANOUT,
)
