"""Stand-ins shared by tests."""

from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["FakeMetrics"]


class FakeMetrics:
    """What the HTTP API needs of ``NodeMetrics``; records the rejected-input
    reasons it reports (the real NodeMetrics has its own tests)."""

    content_type = CONTENT_TYPE_LATEST

    def __init__(self) -> None:
        self.rejected: list[str] = []

    def exposition(self) -> bytes:
        return generate_latest(CollectorRegistry())

    def rejected_input(self, reason: str) -> None:
        self.rejected.append(reason)
