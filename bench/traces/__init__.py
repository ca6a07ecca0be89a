"""Per-request, per-drafter acceptance traces on public prompts (issue 41, docs/TRACES.md)."""
