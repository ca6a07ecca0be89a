"""The worker's one exception tree; the app maps it to HTTP in one handler.

    WorkerError            500, base
    ├── BadRequest         400, the request is invalid for this worker
    ├── ClientDisconnected 499, the client left before the answer (nginx's code; nobody
    │                      reads it: the point is a clean end, logged at info)
    └── Overloaded         503, the queue is full; retry elsewhere
"""

from __future__ import annotations


class WorkerError(Exception):
    status_code = 500


class BadRequest(WorkerError):
    status_code = 400


class ClientDisconnected(WorkerError):
    status_code = 499


class Overloaded(WorkerError):
    status_code = 503
