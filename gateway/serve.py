"""Run the gateway under uvicorn: uvloop, httptools, one worker process.

One worker because the gateway keeps per-process state (outstanding counts, health)
and scales out as replicas behind a load balancer, with shared state in Redis.
"""

from __future__ import annotations

import logging
import sys

import uvicorn

from gateway.app import create_app
from gateway.config import ConfigError, load_config


def serve(config_path: str, host: str | None = None, port: int | None = None,
          policy: str = "learned") -> int:
    """Serve until interrupted; returns a process exit code (2 for a bad config).
    `policy` names the routing policy: learned, static or first (`gateway.learned`)."""
    try:
        config = load_config(config_path)
    except ConfigError as exc:
        print(f"specroute gateway: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.server.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(config, policy=policy), host=host or config.server.host,
                port=config.server.port if port is None else port,
                loop="uvloop", http="httptools", workers=1,
                log_level=config.server.log_level, access_log=False)
    return 0
