"""Self-signed certificates for the TLS tests, made by the `openssl` command line (the
`cryptography` package is not a dependency)."""

from __future__ import annotations

import subprocess
from pathlib import Path


def self_signed(tmp: Path, name: str) -> tuple[Path, Path]:
    """A self-signed certificate (CN `name`, valid for 127.0.0.1, one day) and its key."""
    cert, key = tmp / f"{name}.crt", tmp / f"{name}.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", f"/CN={name}", "-addext", "subjectAltName=IP:127.0.0.1",
                    "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True)
    return cert, key
