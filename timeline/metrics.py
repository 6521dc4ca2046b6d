"""Prometheus metrics of the core library (storage and fan-out); shells add their own."""

from __future__ import annotations

from prometheus_client import Counter, Histogram

MESSAGES_SENT = Counter("timeline_messages_sent_total", "Fan-out messages queued", ["type"])

STORAGE_REQUESTS = Counter(
    "timeline_storage_requests_total", "Storage calls made (one per guarded call)"
)
DELIVERIES = Counter("fanout_deliveries_total", "Timeline entities written by the fan-out")
REMOVALS = Counter("fanout_removals_total", "Timeline entities deleted by the fan-out")
WRITE_REQUESTS = Counter(
    "fanout_write_requests_total", "Timeline write requests (EGT batches and single writes)"
)
BATCH_SIZE = Histogram(
    "fanout_batch_size",
    "Operations per timeline write request",
    buckets=(1, 2, 5, 10, 20, 50, 99, 100),
)
LAG = Histogram(
    "fanout_delivery_lag_seconds",
    "Post created to delivered into a follower's timeline",
    buckets=(0.01, 0.025, 0.05, 0.1, 0.2, 0.35, 0.5, 0.75, 1, 1.5, 2, 3, 5, 10, 30, 60),
)
WRITE_RETRIES = Counter("fanout_write_retries_total", "Timeline write requests retried")
WRITES_EXPIRED = Counter(
    "fanout_writes_expired_total", "Timeline upserts dropped because their reason was too old"
)
TRIM_REQUESTS = Counter(
    "fanout_trim_requests_total", "Storage requests made to trim timelines to the cap"
)
