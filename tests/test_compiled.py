"""The compiled hot path (gateway/compiled.py, built by setup.py with mypyc) gives the
answers of its pure-Python source: the same classification, text-model scores,
validation verdicts and routing decisions. The pure side runs in a child process that
imports every listed module from its `.py` (a path finder ahead of the extensions)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gateway.compiled import (
    COMPILED,
    ROOT,
    extension_path,
    log_start,
    module_name,
    stale,
    summary,
)

BODIES = [
    {"model": "m", "messages": [{"role": "user", "content": "hi"}], "temperature": 0.3,
     "max_tokens": 64, "stream": True, "stream_options": {"include_usage": True}},
    {"model": "m", "messages": [{"role": "system", "content": "Be terse."},
                                {"role": "user", "content": [{"type": "text", "text": "x"}]}],
     "response_format": {"type": "json_object"}, "stop": ["\n"], "seed": 3, "n": 2},
    {"model": "m", "messages": [{"role": "user", "content": "q"}],
     "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}],
     "tool_choice": "auto", "top_p": 0.9, "logprobs": True, "top_logprobs": 2},
    {"model": "m", "messages": []},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "temperature": 3},
    {"model": "m", "messages": [{"role": "wizard", "content": "q"}]},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "max_tokens": -1},
    {"model": "m", "messages": [{"role": "user", "content": "q"}], "stop": [1]},
    {"model": 5, "messages": [{"role": "user", "content": "q"}]},
    {"messages": [{"role": "user", "content": "q"}]},
    "not an object",
]
PURE_FINDER = """
import importlib.abc, importlib.util, sys
PURE = {PURE!r}
class Pure(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        return importlib.util.spec_from_file_location(name, PURE[name]) if name in PURE else None
sys.meta_path.insert(0, Pure())
"""


def answers() -> list[str]:
    """What the listed modules answer on the classifier's and the router's test inputs."""
    from bench.gateway.classifier import HELDOUT_SETS, PROMPT_4KB, _router, chat_request, heldout
    from bench.training.classifier.data import build_dataset
    from gateway.classifier.classify import classify, load_classifier
    from gateway.errors import InvalidRequest
    from gateway.schemas import parse_request

    model, router = load_classifier(), _router()
    texts = [row["text"] for path in HELDOUT_SETS for row in heldout(path)]
    texts += [e.text for e in build_dataset("test", per_class=60)] + [PROMPT_4KB, ""]
    out = []
    for text in texts:
        request = chat_request(text)
        profile = classify(request)
        prediction = model.predict(text)
        decision, pools = router.route(request, profile)
        out.append(repr((profile.task, profile.reasons, profile.prompt_tokens,
                         prediction.label, [round(p, 12) for p in prediction.probabilities],
                         prediction.top_features, decision.pool, decision.k,
                         round(decision.predicted_tokens_per_s, 9), decision.reason,
                         [pool.name for pool in pools])))
    for body in BODIES:
        try:
            parsed = parse_request(body, "chat")
            out.append(repr(parsed))
        except InvalidRequest as exc:
            out.append(f"InvalidRequest {exc.param} {exc}")
    return out


def loaded_files() -> dict[str, str]:
    return {module_name(path): sys.modules[module_name(path)].__file__ or ""
            for path in COMPILED if module_name(path) in sys.modules}


def pure_answers() -> tuple[list[str], dict[str, str]]:
    pure = {module_name(path): str(ROOT / path) for path in COMPILED}
    code = (PURE_FINDER.replace("{PURE!r}", repr(pure)) + "import json, test_compiled\n"
            "print(json.dumps([test_compiled.answers(), test_compiled.loaded_files()]))")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                          capture_output=True, text=True, timeout=240)
    result, files = json.loads(done.stdout)
    return result, files


def test_compiled_and_pure_give_the_same_answers() -> None:
    pure, files = pure_answers()
    assert all(path.endswith(".py") for path in files.values()), files
    assert set(files) == {module_name(path) for path in COMPILED}
    assert answers() == pure


def test_the_build_is_there_where_required() -> None:
    """scripts/test.sh sets SPECROUTE_REQUIRE_COMPILED=1 (CI runs the compiled build): every
    listed module then loads from its extension, built from the source beside it."""
    names = [module_name(path) for path in COMPILED]
    if os.environ.get("SPECROUTE_REQUIRE_COMPILED") != "1":
        pytest.skip("SPECROUTE_REQUIRE_COMPILED is not set")
    assert [name for name in names if extension_path(name) is None] == [], summary()
    assert stale(names) == [], summary()


def test_no_compiled_module_runs_older_code_than_its_source() -> None:
    names = [module_name(path) for path in COMPILED]
    assert stale(names) == [], summary()


def test_every_listed_module_exists_and_the_summary_names_the_build() -> None:
    assert all((ROOT / path).is_file() for path in COMPILED)
    level, line = summary()
    compiled = [p for p in COMPILED if extension_path(module_name(p)) is not None]
    assert ("compiled with mypyc" in line) == bool(compiled)
    assert Path(ROOT / "setup.py").read_text().count("gateway/compiled.py") >= 1


def test_the_start_line_says_which_build_runs(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="specroute.gateway"):
        log_start(logging.getLogger("specroute.gateway"))
    [record] = caplog.records
    assert record.getMessage() == summary()[1]
    assert record.getMessage().startswith("hot path: ")
