"""Benchmarks of the gateway: its overhead beside other gateways and behind Envoy, its
hot path and classifier cost, SLOs under overload, a soak, and the stub upstreams they use."""
