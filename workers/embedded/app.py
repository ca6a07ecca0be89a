"""The worker app: the engine thread runs for the app's lifespan; routes are in `routes`."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from workers.embedded import routes
from workers.embedded.api import GenerationEngine
from workers.embedded.context import WorkerConfig, WorkerState
from workers.embedded.errors import WorkerError
from workers.embedded.scheduler import Scheduler
from workers.tracer_provider import tracer_provider


def create_app(engine: GenerationEngine, config: WorkerConfig,
               on_start: Callable[[], Any] | None = None,
               on_stop: Callable[[], Any] | None = None) -> FastAPI:
    """The worker app over an engine that is already loaded."""

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        scheduler = Scheduler(engine, config.max_running, config.max_queue)
        scheduler.start()
        provider = tracer_provider("specroute-worker")  # OTEL_* variables (workers/tracer_provider.py)
        app.state.tracer = provider.get_tracer("specroute.worker") if provider.listening \
            else None
        app.state.worker = WorkerState(engine, scheduler, config, time.time())
        if on_start is not None:
            on_start()
        try:
            yield
        finally:
            if on_stop is not None:
                on_stop()
            scheduler.stop()
            provider.shutdown()  # flushes the spans still batched

    app = FastAPI(title="specroute embedded worker", lifespan=lifespan, docs_url=None,
                  redoc_url=None, openapi_url=None)
    app.add_exception_handler(WorkerError, routes.worker_error)
    app.add_api_route("/generate", routes.generate, methods=["POST", "PUT"])
    app.add_api_route("/v1/completions", routes.completions, methods=["POST"])
    app.add_api_route("/v1/chat/completions", routes.chat_completions, methods=["POST"])
    for path in ("/health", "/health_generate"):
        app.add_api_route(path, routes.health, methods=["GET"])
    for path in ("/server_info", "/get_server_info"):
        app.add_api_route(path, routes.get_server_info, methods=["GET"])
    for path in ("/model_info", "/get_model_info"):
        app.add_api_route(path, routes.get_model_info, methods=["GET"])
    app.add_api_route("/v1/models", routes.list_models, methods=["GET"])
    app.add_api_route("/v1/loads", routes.loads, methods=["GET"])
    app.add_api_route("/metrics", routes.metrics, methods=["GET"])
    return app
