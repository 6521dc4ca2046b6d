"""Logging set-up shared by every program's ``main()``."""

from __future__ import annotations

import logging


def configure_logging(level: int = logging.INFO) -> None:
    """Plain timestamped lines; the Azure SDK's per-request HTTP logging stays off."""
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("azure").setLevel(logging.WARNING)
