"""The import rule the README's Development section draws, enforced.

Top-level packages, highest first: `specroute` (the command; may import everything),
`bench` (offline: benchmarks, simulator, training), `gateway`, `workers`, `policies`.
A module imports only from its own package or from packages below it. Inside `gateway`
and `workers` the subsystem folders are layered the same way, and no set of modules
anywhere imports itself round a loop. Imports under `if TYPE_CHECKING:` count too:
a type named across a seam is a dependency on it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("specroute", "bench", "gateway", "workers", "policies")  # highest first
SUBLAYERS = {  # highest first; a module directly in the package is its ground layer
    "gateway": ("picker", "http", "core", "upstream", "tenants", "routing", "telemetry",
                "classifier", ""),
    "workers": ("embedded", "fleet", ""),
    "policies": ("planner", ""),
}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[module_name(path)] = path
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports (relative imports resolved)."""
    tree = ast.parse(path.read_text(), str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


def graph() -> dict[str, set[str]]:
    found = modules()
    known = set(found)
    return {name: imports(name, path, known) for name, path in found.items()}


def rank(name: str) -> tuple[int, int]:
    top, _, rest = name.partition(".")
    layers = SUBLAYERS.get(top, ("",))
    sub = rest.partition(".")[0]
    return PACKAGES.index(top), layers.index(sub) if sub in layers else len(layers) - 1


def upward(graph: dict[str, set[str]]) -> list[str]:
    bad = []
    for name, targets in graph.items():
        for target in targets:
            (top, sub), (ttop, tsub) = rank(name), rank(target)
            if ttop < top or (ttop == top and tsub < sub):
                bad.append(f"{name} -> {target}")
    return sorted(bad)


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_module_imports_a_layer_above_its_own() -> None:
    assert upward(graph()) == []


def test_no_import_cycles() -> None:
    assert cycles(graph()) == []


def test_the_checker_sees_an_upward_import_and_a_cycle() -> None:
    fake = {"policies.cost": {"gateway.config"}, "gateway.config": {"policies.cost"},
            "gateway.routing.router": {"gateway.http.app"}, "gateway.http.app": set()}
    assert upward(fake) == ["gateway.routing.router -> gateway.http.app",
                            "policies.cost -> gateway.config"]
    assert cycles(fake) == [["gateway.config", "policies.cost"]]


@pytest.mark.parametrize("package", ["gateway", "policies", "workers"])
def test_runtime_modules_stay_under_400_lines(package: str) -> None:
    long = {name: n for name, path in modules().items() if name.startswith(package + ".")
            and (n := len(path.read_text().splitlines())) > 400}
    assert long == {}
