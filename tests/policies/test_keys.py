"""Every Redis key has one home, policies/keys.py: no other module spells one, and the
keys the docs name are the keys it builds."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from policies import keys

ROOT = Path(__file__).resolve().parent.parent.parent
SOURCES = ("gateway", "policies", "workers", "specroute", "bench", "tests")
HOME = ROOT / "policies" / "keys.py"
DOC_KEY = re.compile(r"`(specroute:[^`\s]*)`")


def key_literals(path: Path) -> list[str]:
    """`line: text` of each string literal or f-string in `path` that starts a key."""
    tree = ast.parse(path.read_text(), str(path))
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef,
                                       ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr)}
    skip = docstrings | {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr)
                         for part in node.values}
    found = []
    for node in ast.walk(tree):
        head = node.values[0] if isinstance(node, ast.JoinedStr) and node.values else node
        if (isinstance(head, ast.Constant) and isinstance(head.value, str)
                and id(node) not in skip and head.value.startswith("specroute:")):
            found.append(f"{node.lineno}: {head.value}")
    return found


def test_no_module_but_policies_keys_spells_a_redis_key():
    spelled = {}
    for package in SOURCES:
        for path in sorted((ROOT / package).rglob("*.py")):
            if path not in (HOME, Path(__file__)) and (found := key_literals(path)):
                spelled[str(path.relative_to(ROOT))] = found
    assert spelled == {}, "Redis keys belong in policies/keys.py"


def test_the_scan_finds_keys_spelled_as_literals_and_f_strings(tmp_path):
    source = tmp_path / "spells.py"
    source.write_text('"""specroute:in a docstring is prose."""\n'
                      'A = "specroute:pools"\n'
                      'def b(pool):\n    return f"specroute:pool:{pool}:workers"\n')
    assert key_literals(source) == ["2: specroute:pools", "4: specroute:pool:"]


def documented_forms() -> set[str]:
    """Every key as the docs write it: placeholders in braces."""
    return {
        keys.STREAM_KEY, keys.AGG_INDEX, keys.POOL_INDEX_KEY, keys.agg_key("{context}"),
        keys.telemetry_batch_key("{id}"),
        keys.desired_k_key("{pool}"), keys.pool_workers_key("{pool}"),
        keys.worker_key("{pool}", "{url}"), keys.draining_key("{pool}", "{url}"),
        keys.desired_fleet_key("{model}"), keys.fleet_move_key("{model}"),
        *keys.limit_window_keys("{tenant}", "{minute}"),  # type: ignore[arg-type]
    }


def test_the_docs_name_only_keys_policies_keys_builds():
    """Reference pages, not the dated results (a history may quote an old key)."""
    forms = documented_forms()
    unknown = {}
    for path in sorted((ROOT / "docs").rglob("*.md")):
        if "results" in path.relative_to(ROOT).parts:
            continue
        for key in DOC_KEY.findall(path.read_text()):
            head, _, last = key.rpartition(":")
            spelled = [f"{head}:{part}" for part in last.split("|")] if "|" in last else [key]
            unknown.update({k: path.name for k in spelled if k not in forms})
    assert unknown == {}


def test_pool_keys_share_one_spelling():
    """`pool:` everywhere (the registry once wrote `pools:`)."""
    pool = keys.PREFIX + "pool:"
    assert keys.desired_k_key("p") == pool + "p:desired_k"
    assert keys.pool_workers_key("p") == pool + "p:workers"
    assert keys.POOL_INDEX_KEY == pool + "index"
