"""A request whose acceptance is far outside its decision's prediction (a loop copying
itself, garbled output) is flagged: in its record, its span, the Prometheus count and the
console's last decisions; one within 3x of its prediction, a short answer or a plain
request is not."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import CollectorRegistry

from gateway.classifier.minimal import minimal_profile
from gateway.schemas import parse_request
from gateway.telemetry.prometheus import FanoutRecorder, PrometheusRecorder
from gateway.telemetry.recent import RecentDecision
from gateway.telemetry.record import Outcome, Reporter, Timer, anomaly
from gateway.telemetry.worker_stats import SpecStats, Usage
from gateway.tenants.auth import DEFAULT_TENANT
from gateway.tenants.limits import Limits
from policies.types import Decision, RequestRecord


@pytest.mark.parametrize(("predicted", "observed", "k", "tokens", "flagged"), [
    (1.8, 6.4, 8, 64, "a loop"),  # 3.6x the prediction
    (3.3, 1.0, 4, 64, "garbled"),  # nothing accepted where 3.3 a step was predicted
    (1.8, 4.0, 8, 64, None),  # 2.2x: within
    (1.8, 6.4, 8, 12, None),  # too short to say
    (1.0, 1.0, 0, 64, None),  # plain: nothing predicted to miss
])
def test_flags_acceptance_far_from_its_prediction(predicted: float, observed: float, k: int,
                                                   tokens: int, flagged: str | None) -> None:
    found = anomaly(predicted, observed, k, tokens)
    assert (found is None) == (flagged is None)
    if flagged:
        assert flagged in found and f"{observed:.2f}" in found


def test_a_looping_request_is_flagged_in_record_span_metrics_and_console() -> None:
    records: list[RequestRecord] = []
    registry = CollectorRegistry()

    class ListRecorder:
        def record(self, record: RequestRecord) -> None:
            records.append(record)

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    reporter = Reporter(FanoutRecorder(ListRecorder(), PrometheusRecorder(registry)), {},
                        Limits().spend, provider.get_tracer("test"))
    request = parse_request({"model": "m", "prompt": "x", "temperature": 0}, "completions")
    for tokens, steps in ((64, 10), (64, 32)):  # 6.4 a step, then 2.0: as predicted
        reporter.record(Outcome(
            request, minimal_profile(request, "t"), DEFAULT_TENANT,
            Decision("ngram", "ngram", 8, "test", predicted_accept_length=1.8), Timer(),
            usage=Usage(5, tokens), spec=SpecStats(verify_steps=steps,
                                                   accept_length=tokens / steps), ok=True))
    looped, fine = records
    assert "3.6x the predicted 1.80" in looped.extra["anomaly"]
    assert "anomaly" not in fine.extra
    spans = exporter.get_finished_spans()
    assert [s.attributes.get("specroute.anomaly") for s in spans] == [
        looped.extra["anomaly"], None]
    assert registry.get_sample_value("specroute_acceptance_anomalies_total",
                                     {"pool": "ngram", "method": "ngram"}) == 1.0
    assert RecentDecision.of(looped).anomaly == looped.extra["anomaly"]
    assert RecentDecision.of(fine).anomaly is None
