"""The OTLP exporter's import failing (another package overwrote opentelemetry/proto, as
xds-protos does) turns tracing off with one error line; the service still starts."""

from __future__ import annotations

import builtins
import logging

import pytest

from workers.tracer_provider import tracer_provider


def test_an_otlp_exporter_that_does_not_import_turns_tracing_off(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real_import = builtins.__import__

    def broken(name: str, *args, **kwargs):
        if name.startswith("opentelemetry.exporter.otlp"):
            raise ImportError("cannot import name 'InstrumentationScope'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:1")
    monkeypatch.setattr(builtins, "__import__", broken)
    with caplog.at_level(logging.ERROR):
        provider = tracer_provider("test")
    assert "tracing off" in caplog.text and "InstrumentationScope" in caplog.text
    with provider.get_tracer("t").start_as_current_span("s"):  # spans still work, unexported
        pass
    provider.shutdown()
