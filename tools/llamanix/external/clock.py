"""The wall clock, as every record llamanix writes dates things: UTC, ISO 8601, to the second."""

from __future__ import annotations

from datetime import UTC, datetime


def now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")
