"""The endpoint picker protocol's wire facts, and ext_proc v3 messages built from them.

Gateway API Inference Extension, `docs/proposals/004-endpoint-picker-protocol`, protocol
v1.0.0 (2025-07-29), as read for docs/PICKER.md:
- the picker is an Envoy `ext_proc` server; per request it sets the header
  `x-gateway-destination-endpoint` to `ip:port` (or `ip:port,ip:port,...`: the first is
  the pick, the rest fallbacks tried in order on retry) AND dynamic metadata
  `envoy.lb` / `x-gateway-destination-endpoint` to the same value (never two values);
- the proxy may narrow the choice with filter metadata `envoy.lb.subset_hint` /
  `x-gateway-destination-endpoint-subset` (a list of `ip:port`); none of those eligible,
  or an empty list: 503 (a request header of that name comes from the client: honoured
  only for tenants that may pin);
- no ready endpoint: ImmediateResponse 503; shed: ImmediateResponse 429;
- on the response the proxy reports `envoy.lb` / `x-gateway-destination-endpoint-served`
  in `metadata_context` (read here from the metadata, else a response header of that
  name, else the ext_proc attribute `upstream.address`).
The message shapes are `envoy/service/ext_proc/v3/external_processor.proto` (PyPI
`xds-protos`).
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Iterable
from urllib.parse import urlsplit

from envoy.config.core.v3 import base_pb2
from envoy.service.ext_proc.v3 import external_processor_pb2 as ext
from envoy.type.v3 import http_status_pb2
from google.protobuf import struct_pb2

DESTINATION = "x-gateway-destination-endpoint"
SERVED = "x-gateway-destination-endpoint-served"
SUBSET = "x-gateway-destination-endpoint-subset"
LB_NAMESPACE = "envoy.lb"
SUBSET_NAMESPACE = "envoy.lb.subset_hint"
# gRPC metadata on the ext_proc stream (the filter's grpc_service.initial_metadata): how
# many endpoints this listener's cluster can use (ORIGINAL_DST takes exactly one)
MAX_ENDPOINTS_METADATA = "x-specroute-max-endpoints"
EXT_PROC_ATTRIBUTES = "envoy.filters.http.ext_proc"  # where Envoy puts requested attributes
# The response side off the request's path (docs/PICKER.md, "Envoy"): a second ext_proc
# filter in `observability_mode` ("send and go": Envoy waits for no answer) streams the
# response to the picker; its stream says so in this gRPC metadata key ("observe"), and
# the picking stream says that an observer follows ("observed"). The pick names its
# exchange in a request header, which the observer's request headers then carry; the
# gateway's x-specroute-* response headers come from dynamic metadata in SPECROUTE_NAMESPACE
# (the route's `response_headers_to_add`), since an observer cannot change the response.
RESPONSE_METADATA = "x-specroute-response"
EXCHANGE = "x-specroute-exchange"
SPECROUTE_NAMESPACE = "specroute"
# The response read from its body alone (docs/PICKER.md, "Envoy"): the response headers
# SKIPped, Envoy sends these attributes (`response_attributes`) with the first body chunk,
# and the picking stream's RESPONSE_METADATA says "body"
RESPONSE_ATTRIBUTES = ("response.code", "upstream.address")


@functools.lru_cache(maxsize=4096)  # workers' URLs: few, asked several times a request
def endpoint_of(url: str) -> str | None:
    """A worker URL's `ip:port` (IPv6 in brackets), the form the protocol and Envoy's
    original-destination cluster take; None for a host name (Envoy would not resolve it)
    or a URL without a usable port."""
    parts = urlsplit(url)
    host = parts.hostname
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
        address = ipaddress.ip_address(host or "")
    except ValueError:
        return None
    return f"[{address}]:{port}" if address.version == 6 else f"{address}:{port}"


def header_map(headers: ext.HttpHeaders) -> dict[str, str]:
    """Lower-cased names to values; Envoy sends `raw_value` (bytes) from 1.27 on, `value`
    before. A repeated header keeps its first value."""
    out: dict[str, str] = {}
    for header in headers.headers.headers:
        value = header.raw_value.decode("latin-1") if header.raw_value else header.value
        out.setdefault(header.key.lower(), value)
    return out


def _struct_value(struct: struct_pb2.Struct, key: str) -> struct_pb2.Value | None:
    return struct.fields[key] if key in struct.fields else None


def subset_hint(request: ext.ProcessingRequest) -> set[str] | None:
    """The endpoints the proxy allows (filter metadata, the protocol's channel), or None
    when it sets no hint (pick from the whole pool)."""
    metadata = request.metadata_context.filter_metadata
    if SUBSET_NAMESPACE not in metadata:
        return None
    value = _struct_value(metadata[SUBSET_NAMESPACE], SUBSET)
    if value is None:
        return None
    if value.HasField("list_value"):
        return {v.string_value.strip() for v in value.list_value.values
                if v.string_value.strip()}
    return {e.strip() for e in value.string_value.split(",") if e.strip()}


def subset_header(headers: dict[str, str]) -> set[str] | None:
    """A subset asked for in a request header of the same name: from the client, not the
    proxy, so it is honoured like a pin (`gateway.picker.place`)."""
    if SUBSET not in headers:
        return None
    return {e.strip() for e in headers[SUBSET].split(",") if e.strip()}


def served_endpoint(request: ext.ProcessingRequest, headers: dict[str, str]) -> str | None:
    """The endpoint that served the response, as the proxy reports it."""
    metadata = request.metadata_context.filter_metadata
    if LB_NAMESPACE in metadata:
        value = _struct_value(metadata[LB_NAMESPACE], SERVED)
        if value is not None and value.string_value:
            return value.string_value.strip()
    if headers.get(SERVED):
        return headers[SERVED].split(",")[0].strip()
    if EXT_PROC_ATTRIBUTES in request.attributes:
        value = _struct_value(request.attributes[EXT_PROC_ATTRIBUTES], "upstream.address")
        if value is not None and value.string_value:
            return value.string_value.strip()
    return None


def response_code(request: ext.ProcessingRequest) -> int:
    """The response's status from the `response.code` attribute; 0 when absent."""
    if EXT_PROC_ATTRIBUTES not in request.attributes:
        return 0
    value = _struct_value(request.attributes[EXT_PROC_ATTRIBUTES], "response.code")
    if value is None:
        return 0
    if value.HasField("number_value"):
        return int(value.number_value)
    return int(value.string_value) if value.string_value.isdigit() else 0


OVERWRITE = base_pb2.HeaderValueOption.OVERWRITE_IF_EXISTS_OR_ADD


def _fill(mutation: ext.HeaderMutation, headers: Iterable[tuple[str, str]]) -> None:
    """Set `headers` in `mutation` in place (no message built and copied per header)."""
    for name, value in headers:
        option = mutation.set_headers.add()
        option.header.key = name
        option.header.raw_value = value.encode("latin-1", "replace")
        option.append_action = OVERWRITE


def _set(headers: Iterable[tuple[str, str]]) -> ext.HeaderMutation:
    mutation = ext.HeaderMutation()
    _fill(mutation, headers)
    return mutation


def pick(endpoints: list[str], body: bytes | None = None,
         headers: Iterable[tuple[str, str]] = (), phase: str = "request_body",
         metadata: Iterable[tuple[str, str]] = ()) -> ext.ProcessingResponse:
    """The pick as the answer to `phase` (the buffered body, or the request headers when
    the body has already been seen or there is none): the destination as header and as
    `envoy.lb` metadata (the same value), with the body's new content-length when it is
    replaced (`body`, set here in a buffered body's answer, else sent by the caller);
    `metadata`: string fields for the `specroute` namespace. Built in place: one message,
    no copies."""
    value = ",".join(endpoints)
    answer = ext.ProcessingResponse()
    common = getattr(answer, phase).response
    common.clear_route_cache = True
    mutation = common.header_mutation
    _fill(mutation, ((DESTINATION, value), *headers))
    if body is not None:
        _fill(mutation, (("content-length", str(len(body))),))
        if phase == "request_body":
            common.body_mutation.body = body
    fields = answer.dynamic_metadata.fields
    fields[LB_NAMESPACE].struct_value.fields[DESTINATION].string_value = value
    ours = None
    for key, text in metadata:
        if ours is None:
            ours = fields[SPECROUTE_NAMESPACE].struct_value.fields
        ours[key].string_value = text
    return answer


def streamed(phase: str, body: bytes, end: bool) -> ext.ProcessingResponse:
    """A body chunk sent back in FULL_DUPLEX_STREAMED mode, where Envoy forwards only
    what the processor returns."""
    common = ext.CommonResponse()
    common.body_mutation.streamed_response.body = body
    common.body_mutation.streamed_response.end_of_stream = end
    return ext.ProcessingResponse(**{phase: ext.BodyResponse(response=common)})


def replaced(phase: str, body: bytes | None) -> ext.ProcessingResponse:
    """A STREAMED body chunk's answer: replaced by `body`, or cleared (None)."""
    common = ext.CommonResponse()
    if body is None:
        common.body_mutation.clear_body = True
    else:
        common.body_mutation.body = body
    return ext.ProcessingResponse(**{phase: ext.BodyResponse(response=common)})


def immediate(status: int, body: bytes, headers: Iterable[tuple[str, str]] = (),
              details: str = "") -> ext.ProcessingResponse:
    """Answer the client now, without an upstream (an OpenAI-shaped JSON error)."""
    return ext.ProcessingResponse(immediate_response=ext.ImmediateResponse(
        status=http_status_pb2.HttpStatus(code=status),  # type: ignore[arg-type]
        headers=_set([("content-type", "application/json"), *headers]),
        body=body, details=details))


def go_on(phase: str, headers: Iterable[tuple[str, str]] = ()) -> ext.ProcessingResponse:
    """Continue unchanged (or with `headers` set) after `phase`, a ProcessingRequest
    field name: request_headers, response_headers, response_body, ... Without headers
    the answer is the same every time: built once (nothing changes a sent message)."""
    headers = tuple(headers)
    if not headers:
        if phase not in _GO_ON:
            _GO_ON[phase] = _go_on(phase, ())
        return _GO_ON[phase]
    return _go_on(phase, headers)


_GO_ON: dict[str, ext.ProcessingResponse] = {}


def _go_on(phase: str, headers: tuple[tuple[str, str], ...]) -> ext.ProcessingResponse:
    common = ext.CommonResponse()
    _fill(common.header_mutation, headers)
    if phase.endswith("headers"):
        return ext.ProcessingResponse(**{phase: ext.HeadersResponse(response=common)})
    if phase.endswith("body"):
        return ext.ProcessingResponse(**{phase: ext.BodyResponse(response=common)})
    return ext.ProcessingResponse(**{phase: ext.TrailersResponse()})
