"""Serving the embedded worker: load the engine, set the worker's default k on it,
register in Redis when asked, run the app under uvicorn. The `specroute worker` command
calls `serve_worker`; the app is in `app`, its routes in `routes`.
"""

from __future__ import annotations

from pathlib import Path

from workers.embedded.app import create_app
from workers.embedded.context import WorkerConfig


def serve_worker(method: str, host: str, port: int, model_dir: str | None,
                 num_speculative_tokens: int | None, threads: int | None,
                 redis_url: str | None, pool: str | None) -> int:
    """Load the engine, then serve until interrupted; registers in Redis when asked."""
    import logging
    import os
    import time

    import torch
    import uvicorn

    from workers.embedded.engine import BUNDLED_MODEL_DIR, Engine, EngineInputError
    from workers.embedded.pages import trim_heap

    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("specroute.worker")
    if threads is not None:
        torch.set_num_threads(threads)
    started = time.monotonic()
    engine = Engine(model_dir=model_dir)
    trim_heap()  # the build's freed temporaries (docs/WORKER.md, "Memory")
    if method not in engine.methods:
        raise SystemExit(f"method {method!r} is not loaded; available: {list(engine.methods)}")
    # The worker's k, decided here once: requests that name no k get it from the engine,
    # and it is what the worker reports (server_info, /metrics, its registration).
    k = engine.default_k[method] if num_speculative_tokens is None else num_speculative_tokens
    if method != "plain":  # a plain worker decodes plainly whatever k it was given
        try:
            engine.set_default_k(method, k)
        except EngineInputError as exc:
            raise SystemExit(f"--num-speculative-tokens: {exc}") from exc
    model_path = str(model_dir or BUNDLED_MODEL_DIR)
    config = WorkerConfig(method=method, k=k, model_path=model_path,
                          served_model_name=Path(model_path).name or model_path)
    on_start = on_stop = None
    if redis_url is not None:
        from workers.embedded.introspection import load_measured
        from workers.fleet.registry import Registration, new_worker_info

        # Behind NAT or in a container the bind address is not what peers dial.
        url = os.environ.get("SPECROUTE_ADVERTISE_URL") or f"http://{host}:{port}"
        info = new_worker_info(url=url, pool=pool or f"embedded-{method}", engine="embedded",
                               method=method, k=k,
                               model=config.served_model_name,
                               pid=os.getpid(), measured=load_measured(model_path))
        registration = Registration(redis_url, info)
        on_start, on_stop = registration.start, registration.stop
    log.info("loaded %s in %.1f s (methods %s, %s torch threads); serving %s k=%d on "
             "http://%s:%d%s", model_path, time.monotonic() - started, ",".join(engine.methods),
             torch.get_num_threads(), method, k, host, port,
             f", registering in Redis as pool {pool or 'embedded-' + method}"
             if redis_url else "")
    app = create_app(engine, config, on_start, on_stop)
    uvicorn.run(app, host=host, port=port, log_level="info", access_log=False)
    return 0
