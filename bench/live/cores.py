"""One core per worker for `bench live` (bench/live/fleets.py's docstring says why): how
many a fleet needs, and pinning a stack's processes (every thread) found by parent."""

from __future__ import annotations

import os
from pathlib import Path


def cores_needed(servers: int, engine: str) -> int:
    """Cores for a fleet of `servers` at concurrency above 1 without contention: one per
    server, and (embedded) one for the gateway, Redis and the bench's client."""
    return servers + (1 if engine == "embedded" else 0)


def available_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def descendant_pids(root: int) -> list[int]:
    """`root` and every process below it (a stack: `specroute up` and what it spawned,
    each child in a session of its own, so found by parent, not by session)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        parent = int(stat.rsplit(")", 1)[1].split()[1])  # state ppid ...
        children.setdefault(parent, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo += children.get(pid, [])
    return sorted(out)


def is_worker(pid: int) -> bool:
    """An embedded worker (`specroute.cli worker ...`)."""
    try:
        argv = (Path("/proc") / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"specroute.cli" in argv and b"worker" in argv


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of `pid` onto `cores` (sched_setaffinity binds one thread)."""
    for task in (Path("/proc") / str(pid) / "task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cores)
        except (ProcessLookupError, OSError):
            continue
