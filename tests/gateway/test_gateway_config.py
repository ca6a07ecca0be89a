"""Config parsing: defaults live in one place, and every error names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.config import ConfigError, hash_api_key, load_config, parse_config

POOL = {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://127.0.0.1:1/"]}


def test_minimal_config_gets_documented_defaults() -> None:
    config = parse_config({"pools": [POOL]})
    assert config.server.max_body_bytes == 4 * 1024 * 1024
    assert config.server.port == 8000
    assert config.pools[0].workers == ("http://127.0.0.1:1",)
    assert config.pools[0].capabilities.constrained_decoding is False
    assert config.tenants == () and config.redis_url is None
    assert config.models == ("m",)


def test_full_config_round_trips(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(f"""
server: {{host: 0.0.0.0, port: 9000, read_timeout_s: 30}}
redis_url: redis://127.0.0.1:6379/0
pools:
  - name: eagle
    engine: vllm
    method: eagle3
    k: 4
    model: llama
    workers: [http://a:1, http://b:2]
    capabilities: {{constrained_decoding: true, tools: true, per_request_k: false,
                    max_context: 8192}}
tenants:
  - {{name: acme, api_key_sha256: [{hash_api_key("k")}], slo_ttft_ms: 500,
      priority: 2, rate_limit_rpm: 60}}
""")
    config = load_config(path)
    assert config.server.read_timeout_s == 30.0
    assert config.pools[0].capabilities.max_context == 8192
    assert config.tenants[0].slo_ttft_ms == 500.0
    assert config.redis_url == "redis://127.0.0.1:6379/0"


@pytest.mark.parametrize(("raw", "key"), [
    ({}, "pools"),
    ({"pools": []}, "pools"),
    ({"pools": [{**POOL, "engine": "tgi"}]}, "pools[0].engine"),
    ({"pools": [{**POOL, "k": -1}]}, "pools[0].k"),
    ({"pools": [{**POOL, "workers": ["ftp://x"]}]}, "pools[0].workers[0]"),
    ({"pools": [{k: v for k, v in POOL.items() if k != "model"}]}, "pools[0].model"),
    ({"pools": [{**POOL, "capabilities": {"tools": "yes"}}]}, "pools[0].capabilities.tools"),
    ({"pools": [{**POOL, "capabilities": {"max_context": 0}}]},
     "pools[0].capabilities.max_context"),
    ({"pools": [POOL, POOL]}, "pools[1].name"),
    ({"pools": [POOL], "server": {"max_body_bytes": 0}}, "server.max_body_bytes"),
    ({"pools": [POOL], "server": {"prot": 1}}, "server.prot"),
    ({"pools": [POOL], "tenants": [{"name": "t", "api_key_sha256": ["abc"]}]},
     "tenants[0].api_key_sha256[0]"),
])
def test_errors_name_the_bad_key(raw: dict, key: str) -> None:
    with pytest.raises(ConfigError) as info:
        parse_config(raw)
    assert str(info.value).startswith(key)


def test_unreadable_and_invalid_yaml(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "bad.yaml").write_text("pools: [")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(tmp_path / "bad.yaml")


def test_health_and_discovery_keys_have_documented_defaults() -> None:
    server = parse_config({"pools": [POOL]}).server
    assert (server.unhealthy_after, server.healthy_after) == (3, 2)
    assert (server.breaker_failures, server.breaker_cooldown_s) == (3, 10.0)
    assert server.discovery_interval_s == 2.0 and server.max_attempts == 3
    with pytest.raises(ConfigError, match=r"server\.healthy_after: must be > 0"):
        parse_config({"pools": [POOL], "server": {"healthy_after": 0}})


def test_supervisor_pool_keys_are_accepted() -> None:
    pool = {**POOL, "model_path": "/models/x", "launch": {"context_length": 8192}}
    parsed = parse_config({"pools": [pool]}).pools[0]
    assert parsed.model_path == "/models/x" and parsed.launch == {"context_length": 8192}
    with pytest.raises(ConfigError, match=r"pools\[0\]\.launch: expected a mapping"):
        parse_config({"pools": [{**POOL, "launch": [1]}]})


def test_a_pools_measured_file_is_checked_by_the_gateway_and_the_supervisor(
        tmp_path: Path) -> None:
    import json

    import yaml

    from policies.fleet import FleetConfigError, load_pool
    from tests.policies.test_planner_benchmarked import NGRAM, document

    good, bad = tmp_path / "measured.json", tmp_path / "broken.json"
    good.write_text(json.dumps(document(NGRAM)))
    bad.write_text(json.dumps({**document(NGRAM), "entries": 3}))
    parsed = parse_config({"pools": [{**POOL, "measured": str(good)}]}).pools[0]
    assert parsed.measured_document() == document(NGRAM)
    for path, message in ((bad, "measured.entries: expected a list"),
                          (tmp_path / "missing.json", "No such file")):
        with pytest.raises(ConfigError, match=rf"pools\[0\]\.measured: .*{message}"):
            parse_config({"pools": [{**POOL, "measured": str(path)}]})
    config = tmp_path / "config.yaml"
    config.write_text(yaml.safe_dump({"pools": [{**POOL, "measured": str(good)}]}))
    spec, _ = load_pool(str(config), "p")
    assert spec.measured_document() == document(NGRAM)
    config.write_text(yaml.safe_dump({"pools": [{**POOL, "measured": str(bad)}]}))
    with pytest.raises(FleetConfigError, match="measured.entries"):
        load_pool(str(config), "p")


def test_pool_config_carries_every_fleet_pool_key() -> None:
    """The gateway's pool schema is a superset of the fleet contract's, so a file the
    supervisor reads is a file the gateway accepts."""
    import dataclasses

    from gateway.config import PoolConfig
    from policies.fleet import FleetPool

    fleet_keys = {f.name for f in dataclasses.fields(FleetPool)}
    assert fleet_keys <= {f.name for f in dataclasses.fields(PoolConfig)}


@pytest.mark.parametrize("redis_url", [None, "redis://127.0.0.1:1"])
def test_one_decay_setting_reaches_the_telemetry_store(redis_url: str | None) -> None:
    """policy.decay_tau_s is the one decay time constant: the store the gateway builds
    (Redis or in-process) uses it; the default is the documented 300 s."""
    from gateway.routing.policy import LearnedRoutingPolicy
    from policies.decision import PolicyConfig

    pool = {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]}
    assert PolicyConfig().decay_tau_s == 300.0
    config = parse_config({"pools": [pool], "redis_url": redis_url,
                           "policy": {"decay_tau_s": 30}})
    assert LearnedRoutingPolicy(config).store.tau_s == 30.0
    with pytest.raises(ConfigError, match=r"policy\.decay_tau_s"):
        parse_config({"pools": [pool], "policy": {"decay_tau_s": 0}})


@pytest.mark.parametrize(("server", "message"), [
    ({"first_token_timeout_s": 0}, r"server\.first_token_timeout_s: must be > 0"),
    ({"body_timeout_s": -1}, r"server\.body_timeout_s: must be > 0"),
    ({"total_timeout_s": "long"}, r"server\.total_timeout_s: expected float"),
    ({"max_concurrency": 1.5}, r"server\.max_concurrency: expected an integer"),
    ({"admin_api_key_sha256": "sk-in-clear"}, r"server\.admin_api_key_sha256: not a hex"),
])
def test_limits_timeouts_and_admin_key_are_checked(server: dict, message: str) -> None:
    pool = {"name": "p", "engine": "sglang", "model": "m", "workers": ["http://a:1"]}
    with pytest.raises(ConfigError, match=message):
        parse_config({"pools": [pool], "server": server})
    digest = hash_api_key("admin").upper()  # a digest in either case
    config = parse_config({"pools": [pool], "server": {"admin_api_key_sha256": digest,
                                                       "total_timeout_s": 60}})
    assert config.server.total_timeout_s == 60.0 and config.server.header_timeout_s == 10.0
