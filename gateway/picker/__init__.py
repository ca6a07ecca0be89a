"""specroute as a Gateway API Inference Extension endpoint picker (docs/PICKER.md).

An Envoy `ext_proc` v3 gRPC server: Envoy asks it, per request, which model-server pod
serves it; the answer comes from the gateway's own decision code (classifier, router,
policy, SLO-aware policy, admission, tenants), and the served response feeds the policy's
telemetry as in standalone mode. Above `gateway.http` in the layer order: a second front
door over the same services, imported by nothing but the CLI.
"""
