"""A vLLM-shaped OpenAI-compatible stub worker for the pass-through adapter.

Same deterministic echo as `sglang_stub`, but speculation facts come the vLLM 0.33
way (`--per-request-spec-decode-metrics summary`): a top-level
`metrics.speculative_decoding` object on the response, and on the final usage chunk
of a stream only when `stream_options.include_usage` is set; errors are wrapped as
`{"error": {...}}` (vLLM's ErrorResponse).

    python tests/openai_stub.py --port P [--model NAME] [--method M] [--k K] [--fail-after N]
"""

from __future__ import annotations

from aiohttp import web
from sglang_stub import Plan, StubServer, parse_args


def vllm_metrics(p: Plan, k: int) -> dict:
    if not p.spec:
        return {}
    steps = p.spec["spec_verify_ct"]
    accepted = p.spec["spec_num_correct_drafts"]
    return {"metrics": {"speculative_decoding": {
        "mean_acceptance_length": 1.0 + accepted / steps,
        "draft_acceptance_rate": p.spec["spec_accept_rate"],
        "acceptance_histogram": [0] * (k + 1), "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": p.spec["spec_num_proposed_drafts"], "num_spec_tokens": k}}}


class VLLMStub(StubServer):
    def extension(self, body: dict, p: Plan) -> dict:
        return vllm_metrics(p, self.cfg.k)

    def stream_tail(self, body: dict, p: Plan, usage: dict) -> list[dict]:
        if not (body.get("stream_options") or {}).get("include_usage"):
            return []
        return [{"usage": usage, **vllm_metrics(p, self.cfg.k)}]

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self.health)
        app.router.add_get("/v1/models", self.models)
        app.router.add_post("/v1/chat/completions", self.openai)
        app.router.add_post("/v1/completions", self.openai)
        return app


if __name__ == "__main__":
    args, cfg = parse_args()
    web.run_app(VLLMStub(cfg).app(), host=args.host, port=args.port, print=None,
                access_log=None)
