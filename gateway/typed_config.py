"""Frozen config dataclasses built from parsed YAML: unknown keys, missing required
keys and wrong scalar types refused with the dotted path of the key (`pools[1].k`).
The gateway's config (`gateway.config`) is built with these."""

from __future__ import annotations

import dataclasses
from typing import Any, TypeVar


class ConfigError(ValueError):
    """The config file is missing, unreadable or invalid; the message names the key."""


T = TypeVar("T")


def check_type(value: Any, expected: type, path: str) -> Any:
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if expected is bool and not isinstance(value, bool):
        raise ConfigError(f"{path}: expected true or false, got {value!r}")
    if expected is int and (isinstance(value, bool) or not isinstance(value, int)):
        raise ConfigError(f"{path}: expected an integer, got {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{path}: expected {expected.__name__}, got {value!r}")
    return value


def build(cls: type[T], raw: Any, path: str, nested: dict[str, Any] | None = None) -> T:
    """Build dataclass `cls` from mapping `raw`, checking keys and scalar types."""
    if not isinstance(raw, dict):
        raise ConfigError(f"{path or 'config'}: expected a mapping, got {type(raw).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ConfigError(f"{path + '.' if path else ''}{unknown[0]}: unknown key")
    kwargs: dict[str, Any] = {}
    for name, f in fields.items():
        key_path = f"{path}.{name}" if path else name
        if name not in raw:
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                raise ConfigError(f"{key_path}: required key is missing")
            continue
        value = raw[name]
        if nested and name in nested:
            kwargs[name] = nested[name](value, key_path)
        elif value is None and f.default is None:
            kwargs[name] = None
        else:
            expected = {"str": str, "int": int, "float": float, "bool": bool,
                        "str | None": str}.get(str(f.type))
            kwargs[name] = check_type(value, expected, key_path) if expected else value
    return cls(**kwargs)


def str_list(value: Any, path: str) -> tuple[str, ...]:
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ConfigError(f"{path}: expected a list of strings")
    return tuple(value)


def positive(value: float, path: str) -> None:
    if value <= 0:
        raise ConfigError(f"{path}: must be > 0, got {value}")


def list_of(item: Any, raw: Any, path: str) -> tuple:
    if not isinstance(raw, list):
        raise ConfigError(f"{path}: expected a list")
    return tuple(item(entry, f"{path}[{i}]") for i, entry in enumerate(raw))
