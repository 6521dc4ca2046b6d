"""Typed settings, read once from ``TIMELINE_*`` environment variables in ``main()``."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, IPvAnyNetwork, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from timeline.delivery.settings import Hybrid, Timing
from timeline.errors import ConfigurationError
from timeline.logs import LogFormat
from timeline.reads.live import StreamTiming
from timeline.storage.accounts import StorageOptions
from timeline.storage.endpoints import account_lines
from timeline.storage.flow.limiter import AdaptiveLimiter, LimiterSettings
from timeline.storage.queue import MessageSender
from timeline.tables.activity import Inactivity
from timeline.tables.counters import WRITE_BUDGET_TIMEOUTS

MAX_HIDDEN_S = 7 * 24 * 3600
"""The longest a queue message can be sent hidden (Azure Queue Storage's limit)."""
CONNECTION_FILE = "storage-connection-string"
"""Written by the running embedded stack so admin commands find its Azurites (one per line)."""


class Settings(BaseSettings):
    """Everything the API, the worker and the CLI can be configured with.

    Over 200 lines on purpose: one field per ``TIMELINE_*`` variable, in one place, so the
    reference in docs/operations.md and the code cannot drift apart."""

    model_config = SettingsConfigDict(env_prefix="TIMELINE_", frozen=True, extra="ignore")

    storage_connection_string: str | None = None
    """One account (kept for compatibility; the same as a list of one)."""
    storage_connection_strings: str | None = None
    """Several accounts, separated by whitespace or newlines, in placement order."""
    storage_table_urls: str | None = None
    """Instead of connection strings: each account's table endpoint, signed in with Entra ID
    (``DefaultAzureCredential``), in placement order."""
    storage_queue_urls: str | None = None
    """With table URLs: the queue endpoint of every account (one for all, or one each);
    default: each account's own."""
    storage_queue_connection_strings: str | None = None
    """With connection strings: the queues' account (one for all, or one each)."""
    storage_ca_file: Path | None = None
    """A CA certificate (PEM) storage's HTTPS is also trusted with."""
    embedded_accounts: int = Field(default=1, ge=1, le=16)
    """Azurite instances ``make run`` starts when no storage is configured."""
    queue_shards: int | None = Field(default=None, ge=1, le=256)
    """Queue shards of a new placement (default: one per account); fixed once stored."""
    placement_lease_s: float = Field(default=15.0, gt=0)
    """A process stops routing when its last read of the placement is older than this."""
    rebalance_margin_s: float = Field(default=30.0, ge=0)
    """Added to the longest lease and storage timeout of any process to make a rebalance's
    fence: the longest Azure works on a request its client has given up on."""
    api_processes: int = Field(default=1, ge=1, le=64)
    """API processes ``make run`` starts on one port (SO_REUSEPORT)."""
    workers: int = Field(default=1, ge=1, le=64)
    """Fan-out worker processes ``make run`` starts."""
    data_dir: Path = Path(".data")
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)
    auth_secret: str | None = None
    page_size: int = Field(default=250, ge=1, le=1000)
    posts_per_minute: int = Field(default=300, ge=0)
    writes_per_minute: int = Field(default=600, ge=0)
    """Follows, unfollows and deletes per user per minute (429 beyond); 0 disables."""
    registrations_per_minute: int = Field(default=60, ge=0)
    """Registrations per client address per minute (429 beyond); 0 disables."""
    azurite_ports: tuple[int, int, int] | None = None
    log_format: LogFormat = "text"
    """``json``: every log line one JSON object (with ``request_id`` in the API's requests)."""
    access_log: bool = True
    """One log line per API request (aiohttp's access log); off saves its CPU per request."""

    max_post_chars: int = Field(default=280, ge=1, le=10_000)
    max_timeline_items: int = Field(default=800, ge=0)
    """Entries a home timeline keeps (older ones are trimmed, and no page reads past them);
    0 keeps everything."""
    fanout_on_read_followers: int = Field(default=10_000, ge=0)
    """Followers from which an author's posts are merged into timelines at read time instead
    of copied (back to copies below half of it); 0 copies every author's posts."""
    max_lists: int = Field(default=100, ge=1, le=1000)
    """Lists one user may hold (409 ``too_many_lists`` beyond)."""
    max_merged_authors: int = Field(default=20, ge=1, le=40)
    """Large authors one timeline page merges; a reader who follows more gets copies of the
    rest."""
    dormant_merge_authors: int = Field(default=200, ge=1, le=1000)
    """Followed authors one page of a dormant reader merges from ``posts`` (those its wake
    has not restored yet); the rest show from its timeline as the wake restores them."""
    max_streams: int = Field(default=200, ge=0)
    """Live timeline streams one API process serves at once (503 beyond)."""
    max_streams_per_user: int = Field(default=4, ge=1)
    """Live streams of one user one API process serves at once (429 beyond)."""
    stream_poll_s: float = Field(default=2.0, ge=0.1, le=60)
    """How often a live stream reads what landed: one query per source per poll."""
    stream_lookback_s: float = Field(default=120.0, ge=0, le=3600)
    """How late after it was made an entry may land and still be streamed."""
    stream_heartbeat_s: float = Field(default=15.0, ge=1, le=300)
    stream_token_recheck_s: float = Field(default=30.0, ge=0.1, le=3600)
    """How often an open stream checks that its token is not revoked (it ends if it is)."""
    token_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    credentials_cache_s: float = Field(default=5.0, gt=0, le=300)
    """How long an API process trusts its read of a user's revocations and of the key ring:
    the bound within which every process honours a revocation or a retired key."""
    idempotency_window_s: int = Field(default=24 * 3600, ge=1)
    """How long an Idempotency-Key stays bound to its first request."""
    trusted_proxies: Annotated[tuple[IPvAnyNetwork, ...], NoDecode] = ()
    """Peers (CIDRs, comma-separated) whose forwarded client address is believed."""
    trusted_proxy_header: Literal["X-Forwarded-For", "Forwarded"] = "X-Forwarded-For"
    """The header the trusted proxies append the client's address to."""
    max_body_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    header_timeout_s: float = Field(default=10.0, gt=0)
    """From a request's first byte to the end of its headers (408 and closed beyond)."""
    body_timeout_s: float = Field(default=10.0, gt=0)
    """From the end of a request's headers to the end of its body (408 and closed beyond)."""
    keepalive_timeout_s: float = Field(default=75.0, gt=0)
    """An idle connection is closed after this (longer than load balancers' 60 s)."""
    max_connections: int = Field(default=1000, ge=1)
    """Connections one API process holds at once; one more gets a 503 and is closed."""
    api_shutdown_grace_s: float = Field(default=10.0, gt=0)
    """A stopping API process has exited within this, whatever its clients do."""
    api_hidden_message_s: int | None = Field(default=None, ge=1)
    """How long an API write's message stays hidden unless released (default: the API write
    deadline plus the storage timeout plus 30 s)."""
    storage_timeout_s: float = Field(default=5.0, gt=0)
    storage_retries: int = Field(default=2, ge=0)

    worker_concurrency: int = Field(default=1024, ge=1)
    worker_storage_concurrency: int = Field(default=256, ge=2)
    """The most table requests a worker keeps in flight; the adaptive limiter finds how many
    storage serves promptly, up to this."""
    worker_request_share: float = Field(default=0.5, gt=0, le=1)
    """Of each account's request budget, the share the workers together may use; the rest is
    left to the API."""
    account_requests_per_s: float = Field(default=20_000, gt=0)
    """An account's request budget (Azure Storage's target: 20,000 a second)."""
    worker_receivers: int = Field(default=4, ge=1)
    worker_write_concurrency: int = Field(default=64, ge=1)
    worker_linger_s: float = Field(default=0.05, ge=0, le=5)
    worker_max_buffered: int = Field(default=100_000, ge=100)
    worker_follower_page_size: int = Field(default=1000, ge=1, le=1000)
    worker_visibility_timeout_s: int = Field(default=30, ge=1)
    worker_max_deliveries: int = Field(default=5, ge=1)
    """Real (non-retryable) failures before a message is parked in its shard's
    ``fanout-<k>-poison``."""
    worker_max_crashes: int = Field(default=3, ge=1)
    """Runs alone in a worker, in a row, that ended with the worker dead before a message is
    parked as ``crashed``; runs in company and leases held unstarted count nothing
    (``fanout_worker.isolation``)."""
    worker_retry_base_s: float = Field(default=0.5, gt=0)
    worker_retry_cap_s: float = Field(default=60.0, gt=0)
    worker_write_deadline_s: float = Field(default=300.0, gt=0)
    worker_sweep_delay_s: float | None = Field(default=None, gt=0)
    worker_idle_sleep_s: float = Field(default=0.5, ge=0)
    worker_idle_max_sleep_s: float = Field(default=2.0, ge=0)
    """Idle receivers' rest doubles from ``worker_idle_sleep_s`` up to this (no less than
    it): the longest a first message after a quiet spell waits to be leased."""
    worker_shutdown_grace_s: float = Field(default=10.0, ge=0)
    expiry_sweep_interval_s: float = Field(default=60.0, ge=0)
    """How often each worker sweeps the ``expiries`` index (0: never)."""
    inactive_days: float = Field(default=14.0, ge=0)
    """Days without a read after which a reader gets no fan-out copies (0: never)."""
    follow_cooldown_s: float | None = Field(default=None, gt=0)
    """How long a follow pair must stay unfollowed before its copies are purged."""
    worker_metrics_port: int | None = Field(default=None, ge=0, le=65535)
    worker_shards: tuple[int, ...] | None = None
    """Queue shards this worker consumes, e.g. ``0-3,7`` (default: all of them): with many
    workers and shards, each takes a few, so idle polling stays within a queue's limits."""

    @field_validator("azurite_ports", mode="before")
    @classmethod
    def _split_ports(cls, value: object) -> object:
        """Accept ``blob,queue,table`` as one comma-separated string."""
        if isinstance(value, str):
            value = tuple(part.strip() for part in value.split(","))
        if isinstance(value, tuple | list) and len(value) != 3:
            raise ValueError("three ports, blob,queue,table")
        return value

    @field_validator("trusted_proxies", mode="before")
    @classmethod
    def _split_networks(cls, value: object) -> object:
        """Accept ``10.0.0.0/8, 192.0.2.7`` (comma- or space-separated CIDRs)."""
        if isinstance(value, str):
            return tuple(part for part in value.replace(",", " ").split() if part)
        return value

    @field_validator("worker_shards", mode="before")
    @classmethod
    def _expand_shards(cls, value: object) -> object:
        """Accept ``0-3,7`` (ranges and single shards, comma-separated), or one number."""
        if isinstance(value, int):
            return (value,)
        if not isinstance(value, str):
            return value
        shards: list[int] = []
        for part in filter(None, (piece.strip() for piece in value.split(","))):
            first, _, last = part.partition("-")
            if int(last or first) < int(first):
                raise ValueError(f"a shard range runs backwards: {part}")
            shards += range(int(first), int(last or first) + 1)
        return tuple(sorted(set(shards)))

    @model_validator(mode="after")
    def _check_accounts(self) -> Settings:
        """Refuse storage that cannot work (e.g. Cosmos DB) before anything starts."""
        queues = self.storage_queue_urls or self.storage_queue_connection_strings
        if queues or not self.uses_embedded_azurite:
            try:
                self.account_lines()
            except ConfigurationError as error:
                raise ValueError(str(error)) from None
        return self

    @property
    def uses_embedded_azurite(self) -> bool:
        return not (
            self.storage_connection_strings
            or self.storage_connection_string
            or self.storage_table_urls
        )

    def account_lines(self) -> list[str]:
        """The configured accounts, one line each (``timeline.storage.endpoints``)."""
        return account_lines(
            self.storage_connection_strings or self.storage_connection_string,
            self.storage_table_urls,
            self.storage_queue_urls,
            self.storage_queue_connection_strings,
        )

    def stream_timing(self) -> StreamTiming:
        return StreamTiming(
            poll_s=self.stream_poll_s,
            lookback_s=self.stream_lookback_s,
            heartbeat_s=self.stream_heartbeat_s,
            token_recheck_s=self.stream_token_recheck_s,
        )

    def storage_options(self, limiter: AdaptiveLimiter | None = None) -> StorageOptions:
        return StorageOptions(
            timeout_s=self.storage_timeout_s,
            retries=self.storage_retries,
            table_connections=max(100, self.worker_write_concurrency + 64),
            placement_lease_s=self.placement_lease_s,
            queue_shards=self.queue_shards,
            limiter=limiter,
            ca_file=str(self.storage_ca_file) if self.storage_ca_file else None,
        )

    def worker_limiter(self, accounts: int = 1) -> AdaptiveLimiter:
        """One worker's adaptive storage limiter: latency is congestion well before the
        storage timeout (a fifth of it), and the request rate stays within the workers'
        share of the accounts' budget, split evenly between the configured workers."""
        share = self.worker_request_share * self.account_requests_per_s * accounts
        return AdaptiveLimiter(
            LimiterSettings(
                initial=min(16, self.worker_storage_concurrency),
                maximum=self.worker_storage_concurrency,
                latency_target_s=self.storage_timeout_s / 5,
                requests_per_s=share / self.workers,
            )
        )

    def hybrid(self, queue: MessageSender) -> Hybrid:
        """When authors are merged at read time; ``queue`` is where crossings are sent."""
        return Hybrid(
            threshold=self.fanout_on_read_followers,
            max_merged=self.max_merged_authors,
            queue=queue,
        )

    def fanout_timing(self) -> Timing:
        """The protocol's time bounds; the sweep must come after any write that can still
        land: the write deadline plus one whole storage call, plus margin (by default 30 s,
        the longest Azure itself works on a request its client has given up on)."""
        earliest = self.worker_write_deadline_s + self.storage_timeout_s
        sweep = self.worker_sweep_delay_s
        if sweep is None:
            sweep = earliest + 30
        elif sweep <= earliest:
            raise ConfigurationError(
                f"TIMELINE_WORKER_SWEEP_DELAY_S must exceed the write deadline plus the "
                f"storage timeout ({earliest:g} s)"
            )
        return Timing(
            write_deadline_s=self.worker_write_deadline_s,
            sweep_delay_s=sweep,
            account_sweep_s=self.credentials_cache_s + self._hidden_s() + 1,
            follow_cooldown_s=self.follow_cooldown_s,
        )

    def inactivity(self) -> Inactivity:
        return Inactivity.days(self.inactive_days)

    def api_write_deadline_s(self) -> float:
        """How long after its start an API write may still send a storage call: room for
        a counted transaction's retries on a contended counter (``WRITE_BUDGET_TIMEOUTS``
        storage timeouts), its last send, and one call before it; past it, a 503."""
        return (WRITE_BUDGET_TIMEOUTS + 2) * self.storage_timeout_s

    def hidden_message_s(self) -> int:
        """How long an API write's message stays hidden unless released: past the write
        deadline plus one whole storage call, with margin (by default 30 s, the longest Azure
        itself works on a request its client has given up on); a queue hides a message for
        at most 7 days."""
        earliest = self.api_write_deadline_s() + self.storage_timeout_s
        hidden = self._hidden_s()
        if self.api_hidden_message_s is not None and hidden <= earliest:
            raise ConfigurationError(
                f"TIMELINE_API_HIDDEN_MESSAGE_S must exceed the API write deadline plus the "
                f"storage timeout ({earliest:g} s: {WRITE_BUDGET_TIMEOUTS + 3} storage timeouts)"
            )
        if hidden > MAX_HIDDEN_S:
            raise ConfigurationError(
                f"an API write's message can stay hidden {MAX_HIDDEN_S} s at most (7 days): "
                f"lower TIMELINE_STORAGE_TIMEOUT_S or TIMELINE_API_HIDDEN_MESSAGE_S"
            )
        return hidden

    def _hidden_s(self) -> int:
        """The hidden time as set, or its default (unchecked: ``hidden_message_s`` checks)."""
        if self.api_hidden_message_s is not None:
            return self.api_hidden_message_s
        return math.ceil(self.api_write_deadline_s() + self.storage_timeout_s + 30)

    def connection_string(self) -> str:
        """Every configured account, one per line (``Storage`` splits them), else the
        embedded Azurites of a running ``make run``."""
        if not self.uses_embedded_azurite:
            return "\n".join(self.account_lines())
        published = self.data_dir / CONNECTION_FILE
        if published.exists():
            return published.read_text().strip()
        raise ConfigurationError(
            "no storage configured: set TIMELINE_STORAGE_CONNECTION_STRINGS or "
            "TIMELINE_STORAGE_TABLE_URLS, or start the embedded stack with `make run` "
            "(`timeline run`)"
        )
