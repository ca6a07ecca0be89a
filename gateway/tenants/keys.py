"""`specroute keys add TENANT`: a new API key, printed once; only its digest is written.

The key is 32 random bytes (`secrets.token_urlsafe`), prefixed `sk-sr-` so that secret
scanners and people recognise it. Its sha256 goes into the tenant's `api_key_sha256` in
the config's `tenants_file` when it has one, else in the config itself (a new tenant is
created with the defaults and the given SLO). The file is replaced atomically (written
beside it, then renamed), so a gateway reloading it never reads half a file. YAML
comments in the rewritten file are not kept: a `tenants_file` keeps the hand-written
config untouched.
"""

from __future__ import annotations

import os
import secrets
import tempfile
from pathlib import Path

import yaml

from gateway.config import (
    ConfigError,
    hash_api_key,
    load_config,
    parse_config,
    read_tenants_file,
)

KEY_PREFIX = "sk-sr-"


def new_key() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def write_atomically(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    try:
        with os.fdopen(fd, "w") as out:
            out.write(text)
        if path.exists():
            os.chmod(tmp, path.stat().st_mode & 0o777)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def add_key(config_path: str | Path, tenant: str, settings: dict | None = None) -> str:
    """Add a new key for `tenant` (created with `settings` when it does not exist yet)
    and return the key; the written config is validated before it replaces the old."""
    path = Path(config_path)
    load_config(path)  # refuse to touch a config that is already invalid
    raw = yaml.safe_load(path.read_text())
    target, document = path, raw
    if raw.get("tenants_file"):
        target = path.parent / raw["tenants_file"]
        tenants = read_tenants_file(target) if target.exists() else []
        document = tenants
    else:
        tenants = raw.setdefault("tenants", []) or []
        raw["tenants"] = tenants
    key = new_key()
    entry = next((t for t in tenants if isinstance(t, dict) and t.get("name") == tenant), None)
    if entry is None:
        entry = {"name": tenant, **(settings or {})}
        tenants.append(entry)
    elif settings:
        raise ConfigError(f"tenant {tenant!r} exists; edit its settings in {target}")
    entry["api_key_sha256"] = [*(entry.get("api_key_sha256") or []), hash_api_key(key)]
    merged = dict(raw)
    if target != path:
        merged.pop("tenants_file")
        merged["tenants"] = [*(raw.get("tenants") or []), *tenants]
    parse_config(merged, path.parent)  # raises ConfigError before anything is written
    write_atomically(target, yaml.safe_dump(document, sort_keys=False))
    return key
