"""The worker's one exception tree; the app maps it to HTTP in one handler.

    WorkerError            500, base
    ├── BadRequest         400, the request is invalid for this worker
    └── Overloaded         503, the queue is full; retry elsewhere
"""

from __future__ import annotations


class WorkerError(Exception):
    status_code = 500


class BadRequest(WorkerError):
    status_code = 400


class Overloaded(WorkerError):
    status_code = 503
