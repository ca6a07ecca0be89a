"""Benchmarks of the decoding engines: the embedded engine's methods, batching, step
profile, acceptance and memory, vLLM CPU beside it, and the measured.json they write."""
