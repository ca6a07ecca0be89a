"""The gateway's typed configuration: the one home for every default.

A YAML file (``specroute gateway --config FILE``) is parsed into frozen dataclasses.
Each dataclass field's default is the only place that default lives; the rest of the
gateway receives the config object and never repeats a default. Validation errors
name the offending key by its dotted path (``pools[1].capabilities.max_context``),
so a bad file is fixed in one read.
"""

from __future__ import annotations

import dataclasses
import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from gateway.typed_config import ConfigError, build, list_of, positive, str_list
from policies.decision import LEARNING_UNITS, PolicyConfig
from policies.fleet import ENGINES, FleetPool
from policies.prior import MeasuredError, read_measured
from workers.fleet.launch import WORKER_API_KEY_ENV
from workers.fleet.registry import REGISTRY_SECRET_ENV


@dataclass(frozen=True, slots=True)
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 4 * 1024 * 1024
    # client side (docs/GATEWAY.md, "Limits and timeouts")
    header_timeout_s: float = 10.0  # request line + headers must arrive within this
    body_timeout_s: float = 30.0  # the whole body must arrive within this; then 408
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this
    max_concurrency: int = 4096  # connections + requests in progress; beyond: 503
    # upstream side, per worker call
    connect_timeout_s: float = 5.0
    first_token_timeout_s: float = 120.0  # a stream's first token (prefill included)
    read_timeout_s: float = 300.0  # longest silence between upstream bytes (inter-token)
    total_timeout_s: float = 1800.0  # a whole request, failover included, streamed or not
    # one write to the client must be taken within this: a client that stops reading (its
    # TCP window at zero) is cut, its slot and its upstream connection freed
    send_timeout_s: float = 30.0
    default_max_tokens: int = 1024  # a chat request without max_tokens (bounded by context)
    # n x max_tokens x (1 + top logprobs) of one request; beyond: 400 (docs/SECURITY.md)
    max_request_work: int = 262_144
    max_response_bytes: int = 64 * 1024 * 1024  # a worker's non-streamed answer; beyond: 502
    admin_api_key_sha256: str | None = None  # guards /metrics and /ready's detail
    # Host header names served (gateway/http/hosts.py): "*" any, "*.example.com" a suffix
    allowed_hosts: tuple[str, ...] = ("localhost", "127.0.0.1", "::1")
    loopback_admin: bool = False  # no admin key: a loopback caller is admin (`specroute up`)
    health_interval_s: float = 2.0  # how often each worker's /health is polled
    unhealthy_after: int = 3  # consecutive failed probes that take a worker out
    healthy_after: int = 2  # consecutive good probes that bring it back
    breaker_failures: int = 3  # consecutive failed requests that open a worker's breaker
    breaker_cooldown_s: float = 10.0  # open breaker: no requests; then one trial request
    discovery_interval_s: float = 2.0  # how often the Redis worker registry is read
    # registry entries must be signed with it (SPECROUTE_REGISTRY_SECRET wins); None: unsigned
    registry_secret: str | None = None
    max_attempts: int = 3  # workers tried per request before the first token is sent
    otel_exporter: str = "none"  # "none" | "console" | "otlp"; OTEL_TRACES_EXPORTER wins
    otel_capture_content: bool = False  # prompts on spans (gen_ai.input.messages): opt in
    log_level: str = "info"
    access_log: bool = False  # one line per request: method, route, status, latency, tenant
    drain_timeout_s: float = 30.0  # on SIGTERM: requests in flight get this long to finish


@dataclass(frozen=True, slots=True)
class Capabilities:
    constrained_decoding: bool = False
    tools: bool = False
    per_request_k: bool = False
    max_context: int = 4096


@dataclass(frozen=True, slots=True)
class PoolConfig(FleetPool):
    """A pool as the gateway reads it: the fleet's shared keys (`policies.fleet.FleetPool`:
    name, engine, model, method, k, workers, model_path and launch, the last two read by
    `specroute supervise` only) and what its workers can do."""

    capabilities: Capabilities = field(default_factory=Capabilities)
    # where registered workers may be (CIDRs, host names, `*` patterns); empty: the hosts
    # of `workers` and loopback (gateway/upstream/discovery.py)
    registry_allow: tuple[str, ...] = ()
    api_key: str | None = None  # sent to its workers (SPECROUTE_WORKER_API_KEY when unset)

    def run_k(self, k: int) -> int:
        """The k a request decided at `k` runs with here: its own on a per-request-k pool,
        the k the server was launched with elsewhere (SGLang and vLLM fix it)."""
        return k if self.capabilities.per_request_k else self.k


@dataclass(frozen=True, slots=True)
class TenantConfig:
    name: str
    api_key_sha256: tuple[str, ...] = ()
    slo_ttft_ms: float = 2000.0
    slo_tpot_ms: float = 200.0
    priority: int = 0  # higher is served first under overload (gateway/routing/admission.py)
    rate_limit_rpm: int = 0  # requests per minute, all replicas together; 0 = unlimited
    rate_limit_tpm: int = 0  # prompt + completion tokens per minute; 0 = unlimited
    max_tokens: int = 0  # cap on a request's max_tokens (and its default); 0 = no cap
    models: tuple[str, ...] = ()  # models this tenant may call; empty = every model
    may_pin: bool = False  # may force a pool or k (x-specroute-pool / x-specroute-k)
    # requests of this tenant admitted at once on one gateway process, queued ones
    # included; one more is a 429 (gateway/routing/admission.py); 0 = no cap
    max_concurrency: int = 0


@dataclass(frozen=True, slots=True)
class LimitsConfig:
    """Tenants' rate limits (gateway/tenants/limits.py): counted in Redis when `redis_url` is set."""

    on_redis_error: str = "open"  # "open": count per process; "closed": refuse with 503


@dataclass(frozen=True, slots=True)
class AdmissionConfig:
    """Per-pool admission and the tenants' SLOs in routing (gateway/routing/admission.py,
    policies/slo.py)."""

    max_inflight_per_worker: int = 0  # requests a worker runs at once; 0 = no queueing
    max_queue: int = 256  # requests waiting per pool; beyond: the worst is shed (429)
    max_wait_s: float = 60.0  # a request waiting longer is shed (429)
    reserved_slots: int = 1  # per pool, kept for the highest priority seen recently
    recent_s: float = 10.0  # how long a priority counts as "seen recently"
    # Off: first-come-first-served queues, no reserved slots, no SLO shedding, and the
    # policy's pick stands (what `specroute bench slo` compares against).
    slo_aware: bool = True
    busy_per_worker: float = 4.0  # without admission: outstanding per worker = "busy"


@dataclass(frozen=True, slots=True)
class PickerConfig:
    """`specroute picker`'s gRPC listener (gateway/picker/server.py, docs/SECURITY.md)."""

    host: str = "127.0.0.1"  # loopback unless told (or `--host`)
    unix_socket: str | None = None  # a path: listen there instead of host:port
    tls_cert_file: str | None = None  # PEM; with tls_key_file, the picker serves TLS
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None  # PEM: clients must show a certificate it signed


@dataclass(frozen=True, slots=True)
class GatewayConfig:
    pools: tuple[PoolConfig, ...]
    server: ServerConfig = field(default_factory=ServerConfig)
    redis_url: str | None = None
    tenants: tuple[TenantConfig, ...] = ()
    # a YAML list of more tenants (relative to the config file), re-read on change
    tenants_file: str | None = None
    # "keys": tenants' API keys (open on loopback only while no tenant is configured);
    # "none": no authentication on any address, by the operator's explicit choice
    auth: str = "keys"
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    admission: AdmissionConfig = field(default_factory=AdmissionConfig)
    policy: PolicyConfig = field(default_factory=PolicyConfig)  # the learned policy's knobs
    picker: PickerConfig = field(default_factory=PickerConfig)

    @property
    def models(self) -> tuple[str, ...]:
        """Served model names, in first-seen order."""
        return tuple(dict.fromkeys(pool.model for pool in self.pools))


def hash_api_key(key: str) -> str:
    """The form in which API keys are stored in the config (hex sha256)."""
    return hashlib.sha256(key.encode()).hexdigest()


DEFAULT_SERVER = ServerConfig()  # for callers given no config (unit tests, tools)
def _is_sha256(text: str) -> bool:
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text.lower())


def _server(raw: Any, path: str) -> ServerConfig:
    server = build(ServerConfig, raw, path, nested={"allowed_hosts": str_list})
    for name in ("max_body_bytes", "header_timeout_s", "body_timeout_s",
                 "keep_alive_timeout_s", "max_concurrency", "connect_timeout_s",
                 "first_token_timeout_s", "read_timeout_s", "total_timeout_s", "send_timeout_s",
                 "health_interval_s", "unhealthy_after", "healthy_after", "breaker_failures",
                 "breaker_cooldown_s", "discovery_interval_s", "max_attempts",
                 "drain_timeout_s", "default_max_tokens", "max_request_work",
                 "max_response_bytes"):
        positive(getattr(server, name), f"{path}.{name}")
    if not 0 <= server.port < 65536:
        raise ConfigError(f"{path}.port: must be in 0..65535, got {server.port}")
    if server.admin_api_key_sha256 is not None and not _is_sha256(server.admin_api_key_sha256):
        raise ConfigError(f"{path}.admin_api_key_sha256: not a hex sha256 digest")
    if server.otel_exporter not in ("none", "console", "otlp"):
        raise ConfigError(f"{path}.otel_exporter: must be none, console or otlp")
    if server.log_level not in ("critical", "error", "warning", "info", "debug", "trace"):
        raise ConfigError(f"{path}.log_level: must be critical, error, warning, info, "
                          f"debug or trace")
    return server


def _pool(raw: Any, path: str) -> PoolConfig:
    def workers(value: Any, p: str) -> tuple[str, ...]:
        urls = str_list(value, p)
        for i, url in enumerate(urls):
            if not url.startswith(("http://", "https://")):
                raise ConfigError(f"{p}[{i}]: not an http(s) URL: {url!r}")
        return tuple(url.rstrip("/") for url in urls)

    def launch(value: Any, p: str) -> dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{p}: expected a mapping")
        return value

    def capabilities(value: Any, p: str) -> Capabilities:
        caps = build(Capabilities, value, p)
        positive(caps.max_context, f"{p}.max_context")
        return caps

    def allow(value: Any, p: str) -> tuple[str, ...]:
        entries = str_list(value, p)
        for i, entry in enumerate(entries):
            if "/" in entry:
                try:
                    ipaddress.ip_network(entry, strict=False)
                except ValueError as exc:
                    raise ConfigError(f"{p}[{i}]: not a CIDR: {entry!r}") from exc
        return entries

    pool = build(PoolConfig, raw, path,
                  nested={"workers": workers, "capabilities": capabilities,
                          "launch": launch, "registry_allow": allow})
    if pool.engine not in ENGINES:
        raise ConfigError(f"{path}.engine: must be one of {', '.join(ENGINES)}, "
                          f"got {pool.engine!r}")
    if pool.k < 0:
        raise ConfigError(f"{path}.k: must be >= 0, got {pool.k}")
    try:
        if pool.measured:
            read_measured(pool.measured)
    except MeasuredError as exc:
        raise ConfigError(f"{path}.measured: {exc}") from exc
    return pool


def _tenant(raw: Any, path: str) -> TenantConfig:
    def hashes(value: Any, p: str) -> tuple[str, ...]:
        out = str_list(value, p)
        for i, h in enumerate(out):
            if not _is_sha256(h):
                raise ConfigError(f"{p}[{i}]: not a hex sha256 digest")
        return tuple(h.lower() for h in out)

    tenant = build(TenantConfig, raw, path, nested={"api_key_sha256": hashes,
                                                     "models": str_list})
    for name in ("rate_limit_rpm", "rate_limit_tpm", "max_tokens", "max_concurrency"):
        if getattr(tenant, name) < 0:
            raise ConfigError(f"{path}.{name}: must be >= 0")
    for name in ("slo_ttft_ms", "slo_tpot_ms"):
        positive(getattr(tenant, name), f"{path}.{name}")
    return tenant


def _policy(raw: Any, path: str) -> PolicyConfig:
    """The learned policy's top-level knobs; their defaults live in `PolicyConfig`."""
    if isinstance(raw, dict) and "learner" in raw:
        raise ConfigError(f"{path}.learner: not settable from the config file")
    policy = build(PolicyConfig, raw or {}, path)
    for name in ("explore_rate", "explore_cap"):
        if not 0.0 <= getattr(policy, name) <= 1.0:
            raise ConfigError(f"{path}.{name}: must be in 0..1, got {getattr(policy, name)}")
    positive(policy.refit_interval_s, f"{path}.refit_interval_s")
    positive(policy.decay_tau_s, f"{path}.decay_tau_s")
    if policy.learning_unit not in LEARNING_UNITS:
        raise ConfigError(f"{path}.learning_unit: one of {LEARNING_UNITS}, not {policy.learning_unit!r}")
    return policy


def _limits(raw: Any, path: str) -> LimitsConfig:
    limits = build(LimitsConfig, raw or {}, path)
    if limits.on_redis_error not in ("open", "closed"):
        raise ConfigError(f"{path}.on_redis_error: must be open or closed, "
                          f"got {limits.on_redis_error!r}")
    return limits


def _picker(raw: Any, path: str) -> PickerConfig:
    picker = build(PickerConfig, raw or {}, path)
    if (picker.tls_cert_file is None) != (picker.tls_key_file is None) or (
            picker.tls_client_ca_file and not picker.tls_cert_file):
        raise ConfigError(f"{path}: tls_cert_file and tls_key_file go together "
                          f"(and tls_client_ca_file needs them)")
    return picker


def _admission(raw: Any, path: str) -> AdmissionConfig:
    admission = build(AdmissionConfig, raw or {}, path)
    for name in ("max_inflight_per_worker", "reserved_slots"):
        if getattr(admission, name) < 0:
            raise ConfigError(f"{path}.{name}: must be >= 0")
    for name in ("max_queue", "max_wait_s", "recent_s", "busy_per_worker"):
        positive(getattr(admission, name), f"{path}.{name}")
    return admission


def read_tenants_file(path: Path) -> list:
    """The tenants listed in a `tenants_file`: a YAML list (or a mapping with `tenants:`);
    none while the file does not exist (`specroute keys add` creates it)."""
    if not path.exists():
        return []
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"tenants_file: cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"tenants_file: {path} is not valid YAML: {exc}") from exc
    if isinstance(raw, dict):
        raw = raw.get("tenants")
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise ConfigError(f"tenants_file: {path} must hold a list of tenants")
    return raw


def parse_config(raw: Any, base_dir: Path | None = None) -> GatewayConfig:
    """Validate a parsed YAML document into a `GatewayConfig`; a `tenants_file` is read
    relative to `base_dir` (the config file's folder)."""
    if isinstance(raw, dict) and raw.get("tenants_file") is not None:
        raw = dict(raw)
        name = raw["tenants_file"]
        if not isinstance(name, str):
            raise ConfigError(f"tenants_file: expected str, got {name!r}")
        listed = read_tenants_file((base_dir or Path.cwd()) / name)
        raw["tenants"] = [*(raw.get("tenants") or []), *listed]
    config = build(GatewayConfig, raw, "", nested={
        "server": _server,
        "pools": lambda v, p: list_of(_pool, v, p),
        "tenants": lambda v, p: list_of(_tenant, v or [], p),
        "policy": _policy,
        "limits": _limits,
        "admission": _admission,
        "picker": _picker,
    })
    if not config.pools:
        raise ConfigError("pools: at least one pool is required")
    if config.auth not in ("keys", "none"):
        raise ConfigError(f"auth: must be keys or none, got {config.auth!r}")
    if config.auth == "none" and config.tenants:
        raise ConfigError("auth: none with tenants configured; remove one or the other")
    for kind, names in (("pools", [p.name for p in config.pools]),
                        ("tenants", [t.name for t in config.tenants])):
        seen: set[str] = set()
        for i, name in enumerate(names):
            if name in seen:
                raise ConfigError(f"{kind}[{i}].name: duplicate name {name!r}")
            seen.add(name)
    for i, pool in enumerate(config.pools):
        if not pool.workers and not config.redis_url:
            raise ConfigError(f"pools[{i}].workers: needs at least one worker URL "
                              f"(or set redis_url to discover workers)")
    return config


REDIS_URL_ENV = "REDIS_URL"


def with_environment(config: GatewayConfig, environ: Mapping[str, str]) -> GatewayConfig:
    """Secrets from the environment rather than the config file (a Secret, not a
    ConfigMap): `REDIS_URL` (with Redis's password) replaces `redis_url`, as for
    `specroute supervise` and `fleet-controller`; `SPECROUTE_REGISTRY_SECRET` is
    `server.registry_secret`, and `SPECROUTE_WORKER_API_KEY` the `api_key` of every pool
    that sets none."""
    url = environ.get(REDIS_URL_ENV)
    if url:
        config = dataclasses.replace(config, redis_url=url)
    secret = environ.get(REGISTRY_SECRET_ENV)
    if secret:
        config = dataclasses.replace(
            config, server=dataclasses.replace(config.server, registry_secret=secret))
    key = environ.get(WORKER_API_KEY_ENV)
    if key:
        config = dataclasses.replace(config, pools=tuple(
            pool if pool.api_key else dataclasses.replace(pool, api_key=key)
            for pool in config.pools))
    return config


def load_config(path: str | Path) -> GatewayConfig:
    """Read and validate the YAML config at `path`."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror}") from exc
    try:
        raw = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config {path} is not valid YAML: {exc}") from exc
    return parse_config(raw, Path(path).parent)
