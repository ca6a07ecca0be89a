"""`specroute bench picker`: the four-way summary's arithmetic and its JSON keys, the
bootstraps it runs, and the command's wiring."""

from __future__ import annotations

from bench.gateway.overhead import Target
from bench.gateway.picker import EPP, EPP_BODY, envoy_summary
from gateway.picker.envoy import alone_bootstrap, bootstrap
from specroute.cli import build_parser


def target(name: str, latencies: list[float], done: int, seconds: float = 2.0) -> Target:
    t = Target(name, f"http://127.0.0.1:1/{name}")
    for stream in (False, True):
        t.latency[stream] = [x + (0.5 if stream else 0.0) for x in latencies]
        t.done[stream], t.seconds[stream] = done, seconds
    return t


def test_the_summary_gives_added_p50_and_throughput_over_smg() -> None:
    targets = [target("direct", [1.0, 1.0, 1.0], 2000), target("envoy", [2.0, 2.0, 2.5], 1800),
               target(EPP, [4.0, 4.0, 5.0], 400), target("specroute", [3.0, 3.0, 3.0], 300),
               target("smg", [2.5, 2.5, 2.5], 1000)]
    out = envoy_summary(targets)
    for suffix in ("", "_stream"):
        assert out[f"envoy_epp_added_p50_ms{suffix}"] == 3.0
        assert out[f"envoy_alone_added_p50_ms{suffix}"] == 1.0
        assert out[f"envoy_epp_over_alone_p50_ms{suffix}"] == 2.0
        assert out[f"specroute_added_p50_ms{suffix}"] == 2.0
        assert out[f"smg_added_p50_ms{suffix}"] == 1.5
        assert out[f"envoy_epp_rps_over_smg{suffix}"] == 0.4  # 200 / 500 req/s
        assert out[f"envoy_alone_rps_over_smg{suffix}"] == 1.8
        assert out[f"specroute_rps_over_smg{suffix}"] == 0.3
    assert [(r["path"], r["stream"]) for r in out["rows"]][:5] == [
        ("direct", False), ("envoy", False), (EPP, False), ("specroute", False),
        ("smg", False)]


def test_a_path_that_failed_has_no_ratio() -> None:
    smg = Target("smg", error="not installed: no network")
    out = envoy_summary([target("direct", [1.0], 10), target("envoy", [2.0], 10),
                         target(EPP, [3.0], 10), target("specroute", [3.0], 10), smg])
    assert out["envoy_epp_rps_over_smg"] is None and out["smg_added_p50_ms"] is None
    assert out["envoy_epp_added_p50_ms"] == 2.0
    assert out["envoy_epp_observe_added_p50_ms"] is None  # not measured: no figure
    assert out["envoy_epp_body_rps_over_smg"] is None
    assert {"path": "smg", "stream": False, "error": "not installed: no network"} in out["rows"]


def test_the_body_only_row_has_its_own_figures() -> None:
    out = envoy_summary([target("direct", [1.0], 10), target("envoy", [2.0], 10),
                         target(EPP, [4.0], 400), target(EPP_BODY, [3.5], 500),
                         target("smg", [2.5], 1000)])
    assert out["envoy_epp_body_added_p50_ms"] == 2.5
    assert out["envoy_epp_body_over_alone_p50_ms"] == 1.5
    assert out["envoy_epp_body_rps_over_smg"] == 0.5


def test_the_bootstraps_it_runs() -> None:
    alone = alone_bootstrap(("127.0.0.1", 1), ("127.0.0.1", 2), [("127.0.0.1", 3)])
    [cluster] = alone["static_resources"]["clusters"]
    assert cluster["lb_policy"] == "ROUND_ROBIN"
    [listener] = alone["static_resources"]["listeners"]
    manager = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert [f["name"] for f in manager["http_filters"]] == ["envoy.filters.http.router"]
    inline = bootstrap(("127.0.0.1", 4), ("127.0.0.1", 5), {"original_dst": ("127.0.0.1", 6)})
    manager = inline["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    [picking, _] = manager["http_filters"]  # the default: the picker reads the response
    assert picking["typed_config"]["processing_mode"]["response_body_mode"] == "STREAMED"
    epp = bootstrap(("127.0.0.1", 4), ("127.0.0.1", 5), {"original_dst": ("127.0.0.1", 6)},
                    response="observe")
    manager = epp["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    picking, observer, _ = manager["http_filters"]
    assert picking["typed_config"]["processing_mode"]["response_header_mode"] == "SKIP"
    assert observer["typed_config"]["observability_mode"] is True
    assert observer["typed_config"]["processing_mode"]["response_body_mode"] == "STREAMED"
    body = bootstrap(("127.0.0.1", 4), ("127.0.0.1", 5), {"original_dst": ("127.0.0.1", 6)},
                     response="body")
    manager = body["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0][
        "typed_config"]
    [picking, _] = manager["http_filters"]  # one filter: the body alone, with attributes
    config = picking["typed_config"]
    assert config["processing_mode"]["response_header_mode"] == "SKIP"
    assert config["processing_mode"]["response_body_mode"] == "STREAMED"
    assert config["response_attributes"] == ["response.code", "upstream.address"]
    added = {h["header"]["key"] for h in manager["route_config"]["virtual_hosts"][0][
        "routes"][0]["response_headers_to_add"]}
    assert "x-specroute-pool" in added


def test_envoy_closes_idle_pod_connections_before_the_pods_do() -> None:
    """uvicorn (SGLang, vLLM, the bench's upstream) closes a connection idle for 5 s; a
    request Envoy sends on one as it closes is reset (503 UC/UO at c = 32, seen in the
    bench's access log): every cluster of pods times idle connections out sooner."""
    configs = [bootstrap(("127.0.0.1", 4), ("127.0.0.1", 5),
                         {"original_dst": ("127.0.0.1", 6), "override_host": ("127.0.0.1", 7)},
                         [("127.0.0.1", 8)]),
               alone_bootstrap(("127.0.0.1", 1), ("127.0.0.1", 2), [("127.0.0.1", 3)])]
    pods = [c for config in configs for c in config["static_resources"]["clusters"]
            if c["name"] != "picker"]
    assert len(pods) == 3
    for cluster in pods:
        options = cluster["typed_extension_protocol_options"][
            "envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        idle = options["common_http_protocol_options"]["idle_timeout"]
        assert float(idle.removesuffix("s")) < 5, cluster["name"]


def test_specroute_bench_picker_runs_this_module() -> None:
    args = build_parser().parse_args(["bench", "picker", "--quick", "--json", "--body-mode",
                                      "FULL_DUPLEX_STREAMED"])
    assert (args.target, args.quick, args.body_mode) == ("picker", True, "FULL_DUPLEX_STREAMED")
