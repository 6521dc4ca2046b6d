"""Typed settings, read once from ``TIMELINE_*`` environment variables in ``main()``."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from timeline.errors import ConfigurationError
from timeline.fanout import Timing
from timeline.retry import RetryPolicy
from timeline.storage import StorageOptions

AUTH_SECRET_FILE = "auth-secret"  # noqa: S105 - a file name, not a secret
CONNECTION_FILE = "storage-connection-string"
"""Written by the running embedded stack so admin commands find its Azurite."""


class Settings(BaseSettings):
    """Everything the API, the worker and the CLI can be configured with."""

    model_config = SettingsConfigDict(env_prefix="TIMELINE_", frozen=True, extra="ignore")

    storage_connection_string: str | None = None
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

    max_post_chars: int = Field(default=280, ge=1, le=10_000)
    token_ttl_s: int = Field(default=30 * 24 * 3600, ge=60)
    max_body_bytes: int = Field(default=16 * 1024, ge=1024, le=1024 * 1024)
    storage_timeout_s: float = Field(default=5.0, gt=0)
    storage_retries: int = Field(default=2, ge=0)

    worker_concurrency: int = Field(default=1024, ge=1)
    worker_receivers: int = Field(default=4, ge=1)
    worker_write_concurrency: int = Field(default=64, ge=1)
    worker_linger_s: float = Field(default=0.05, ge=0, le=5)
    worker_max_buffered: int = Field(default=100_000, ge=100)
    worker_follower_page_size: int = Field(default=1000, ge=1, le=1000)
    worker_visibility_timeout_s: int = Field(default=30, ge=1)
    worker_max_deliveries: int = Field(default=5, ge=1)
    """Real (non-retryable) failures before a message is parked in ``fanout-poison``."""
    worker_max_crashes: int = Field(default=20, ge=1)
    """Leases that ended with the worker dead before a message is parked as ``crashed``."""
    worker_retry_base_s: float = Field(default=0.5, gt=0)
    worker_retry_cap_s: float = Field(default=60.0, gt=0)
    worker_write_deadline_s: float = Field(default=300.0, gt=0)
    worker_sweep_delay_s: float | None = Field(default=None, gt=0)
    worker_arrival_window_s: float = Field(default=30.0, gt=0)
    worker_idle_sleep_s: float = Field(default=0.5, ge=0)
    worker_shutdown_grace_s: float = Field(default=10.0, ge=0)
    worker_metrics_port: int | None = Field(default=None, ge=0, le=65535)

    @field_validator("azurite_ports", mode="before")
    @classmethod
    def _split_ports(cls, value: object) -> object:
        """Accept ``blob,queue,table`` as one comma-separated string."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(","))
        return value

    @property
    def uses_embedded_azurite(self) -> bool:
        return self.storage_connection_string is None

    def storage_options(self) -> StorageOptions:
        return StorageOptions(
            timeout_s=self.storage_timeout_s,
            retries=self.storage_retries,
            table_connections=max(100, self.worker_write_concurrency + 64),
        )

    def retry_policy(self) -> RetryPolicy:
        return RetryPolicy(base_s=self.worker_retry_base_s, cap_s=self.worker_retry_cap_s)

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
            arrival_window_s=self.worker_arrival_window_s,
        )

    def connection_string(self) -> str:
        """The configured storage, else the embedded Azurite of a running ``make run``."""
        if self.storage_connection_string:
            return self.storage_connection_string
        published = self.data_dir / CONNECTION_FILE
        if published.exists():
            return published.read_text().strip()
        raise ConfigurationError(
            "no storage configured: set TIMELINE_STORAGE_CONNECTION_STRING, "
            "or start the embedded stack with `make run` (`timeline run`)"
        )

    def secret_bytes(self) -> bytes:
        """The HMAC key: the configured one, or the one generated once under ``data_dir``."""
        if self.auth_secret:
            return self.auth_secret.encode()
        return load_or_create_secret(self.data_dir).encode()


def load_or_create_secret(data_dir: Path) -> str:
    """Return the secret stored under ``data_dir``, creating it (mode 0600) on first use.

    The new secret is written to a private temporary file and hard-linked into place, so a
    concurrent reader sees either no file or the whole secret, and only one secret ever wins.
    """
    path = data_dir / AUTH_SECRET_FILE
    if not path.exists():
        data_dir.mkdir(parents=True, exist_ok=True)
        staging = data_dir / f".{AUTH_SECRET_FILE}.{os.getpid()}.{secrets.token_hex(4)}"
        fd = os.open(staging, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(secrets.token_urlsafe(32))
        try:
            os.link(staging, path)
        except FileExistsError:
            pass
        finally:
            staging.unlink()
    return path.read_text().strip()
