"""The OpenTelemetry tracer provider the gateway and the embedded worker share.

Configured by the standard variables (opentelemetry-specification, "SDK environment
variables"): `OTEL_TRACES_EXPORTER` (otlp, console or none) chooses the exporter and wins
over the config's `otel_exporter`; setting `OTEL_EXPORTER_OTLP_ENDPOINT` or
`OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` alone also turns OTLP on. The OTLP exporter speaks
HTTP/protobuf (default endpoint http://localhost:4318/v1/traces) and reads its own
`OTEL_EXPORTER_OTLP_*` variables (endpoint, headers, timeout, compression);
`OTEL_SERVICE_NAME` names the service (default given by the caller); the batch
processor reads `OTEL_BSP_*`. With no exporter the provider has no processor and
`listening` stays False, so callers skip spans altogether.
"""

from __future__ import annotations

import logging
import os

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
)

logger = logging.getLogger(__name__)
EXPORTERS = ("none", "console", "otlp")


class ListeningTracerProvider(TracerProvider):
    """An SDK TracerProvider that knows whether anyone receives its spans. Without a span
    processor a span is still built and its attributes checked for nothing, so callers
    skip it."""

    listening: bool = False

    def add_span_processor(self, span_processor: SpanProcessor) -> None:
        self.listening = True
        super().add_span_processor(span_processor)


def chosen_exporter(configured: str = "none") -> str:
    """The exporter to use: `OTEL_TRACES_EXPORTER` if set, else otlp when an OTLP
    endpoint variable is set, else `configured`."""
    env = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if env:
        return env if env in EXPORTERS else "none"
    if configured == "none" and (os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT")
                                 or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")):
        return "otlp"
    return configured


def tracer_provider(service_name: str, configured: str = "none") -> ListeningTracerProvider:
    """A provider named `service_name` unless `OTEL_SERVICE_NAME` says otherwise."""
    named = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": service_name}
    provider = ListeningTracerProvider(resource=Resource.create(named))
    exporter = chosen_exporter(configured)
    if exporter == "console":
        provider.add_span_processor(SimpleSpanProcessor(ConsoleSpanExporter()))
    elif exporter == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:  # e.g. opentelemetry/proto overwritten by another package
            logger.error("tracing off: the OTLP exporter does not import (%s); reinstall "
                         "opentelemetry-proto (docs/PICKER.md)", exc)
            return provider
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider
