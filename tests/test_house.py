"""The house's rules, read from the source: no import circle anywhere in `octopipe` (lazy and
TYPE_CHECKING imports count: a reader follows them too), and each runtime group importing only
what its `MUST_NOT_IMPORT` allows (docs/ARCHITECTURE.md)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
RUNTIME_GROUPS = ("data", "checkpoint", "parallel", "model", "step", "job", "launch", "measure")


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted((SRC / "octopipe").rglob("*.py")):
        name = ".".join(path.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


MODULES = _modules()


def _imported(name: str, path: Path) -> set[str]:
    """The project modules `path` imports, each named as the longest module that exists."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            # `from pkg import mod` imports the module when one of that name exists
            targets = [f"{base}.{alias.name}" for alias in node.names] or [base]
        else:
            continue
        for target in targets:
            while target and target not in MODULES:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


GRAPH = {name: _imported(name, path) for name, path in MODULES.items()}


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
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
    return found


def test_the_graph_is_read():
    """The reader sees the imports it must judge (a reader that saw none would pass anything)."""
    assert "octopipe.runtime.step.worker" in GRAPH["octopipe.runtime.job.session"]
    assert "octopipe.runtime.model.recipe" in GRAPH["octopipe.runtime.model.hf"]


def test_circles_are_found():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_circle():
    assert _circles(GRAPH) == []


@pytest.mark.parametrize("group", RUNTIME_GROUPS)
def test_runtime_group_keeps_to_its_layer(group):
    package = importlib.import_module(f"octopipe.runtime.{group}")
    forbidden = {f"octopipe.runtime.{other}" for other in package.MUST_NOT_IMPORT}
    assert f"octopipe.runtime.{group}" not in forbidden
    assert "no " in package.__doc__.split("\n\n")[0], "the first lines say what it must not do"
    breaches = sorted(
        f"{name} imports {target}"
        for name, targets in GRAPH.items()
        if name.startswith(f"octopipe.runtime.{group}.")
        for target in targets
        if any(target == f or target.startswith(f + ".") for f in forbidden)
    )
    assert breaches == []


def test_no_runtime_module_among_many_siblings():
    """The runtime stays grouped: no folder of it holds more than a dozen modules."""
    runtime = SRC / "octopipe" / "runtime"
    for folder in [runtime, *(p for p in runtime.iterdir() if p.is_dir())]:
        modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
        assert len(modules) <= 12, f"{folder} holds {len(modules)} modules"
