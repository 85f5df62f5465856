"""What a traced node exports and where (issue 24): ``NodeConfig.tracing``.

Only configuration lives here: the spans themselves are made by
``_tracing.py``, which a node imports only when it is traced (it needs the
``otlp`` extra: the OpenTelemetry SDK and its OTLP/HTTP exporter).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Tracing"]


@dataclass(frozen=True)
class Tracing:
    """Export every session run, Main message cycle and model call as an
    OpenTelemetry span.

    ``endpoint``: the OTLP/HTTP traces URL (``http://127.0.0.1:4318/v1/traces``,
    Phoenix's ``http://127.0.0.1:6006/v1/traces``); ``headers`` go with every
    export (an API key). ``sampling_ratio``: the share of traces recorded (a
    trace is kept or dropped whole, by its id). ``service_name`` and
    ``resource`` name the node in the viewer; ``service_name`` is also the
    Arize Phoenix project the spans are filed under (the resource attribute
    ``openinference.project.name``) unless ``resource`` names one. ``capture_content``: model-call
    spans also carry the prompt and the reply (off by default: they may hold
    what users said). Spans leave through a batching processor: at most
    ``max_queue_size`` wait (past it the oldest are dropped and counted in
    ``sessiontree_spans_dropped_total``), exported every
    ``schedule_delay`` s in batches of up to ``max_export_batch_size``, each
    export given up after ``export_timeout`` s. ``exporter`` replaces the
    OTLP exporter with any OpenTelemetry ``SpanExporter`` (tests, an
    in-process viewer); then ``endpoint`` is not needed.

    ``ValueError`` for a ratio outside [0, 1], a non-positive size or time, or
    neither an endpoint nor an exporter.
    """

    endpoint: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    sampling_ratio: float = 1.0
    service_name: str = "sessiontree"
    resource: Mapping[str, str] = field(default_factory=dict)
    capture_content: bool = False
    max_queue_size: int = 2048
    max_export_batch_size: int = 512
    schedule_delay: float = 1.0
    export_timeout: float = 10.0
    exporter: Any = None

    def __post_init__(self) -> None:
        if self.endpoint is None and self.exporter is None:
            msg = "tracing: give an endpoint (OTLP/HTTP traces URL) or an exporter"
            raise ValueError(msg)
        if not (0.0 <= self.sampling_ratio <= 1.0):
            msg = f"tracing: sampling_ratio must be in [0, 1], got {self.sampling_ratio!r}"
            raise ValueError(msg)
        for name in ("max_queue_size", "max_export_batch_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                msg = f"tracing: {name} must be a positive int, got {getattr(self, name)!r}"
                raise ValueError(msg)
        if self.max_export_batch_size > self.max_queue_size:
            msg = "tracing: max_export_batch_size must not exceed max_queue_size"
            raise ValueError(msg)
        for name in ("schedule_delay", "export_timeout"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                msg = f"tracing: {name} must be a positive number of seconds, got {value!r}"
                raise ValueError(msg)
        object.__setattr__(self, "headers", dict(self.headers))
        object.__setattr__(self, "resource", dict(self.resource))
