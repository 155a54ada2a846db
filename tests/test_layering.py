"""The package's layers: no import cycles at module level, and the lower layers never
import the upper ones (models never import training, LoRA training, the server or the
CLI; the compiler never imports models)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1] / "orion"

# a layer -> packages it must not import (anywhere in the file, lazily included)
FORBIDDEN = {
    "orion.ir": ("orion.models", "orion.train", "orion.lora", "orion.serve", "orion.cli"),
    "orion.formats": ("orion.models", "orion.train", "orion.lora", "orion.serve",
                      "orion.cli"),
    "orion.tokenizers": ("orion.models", "orion.train", "orion.lora", "orion.serve",
                         "orion.cli"),
    "orion.models": ("orion.train", "orion.lora", "orion.serve", "orion.cli"),
    "orion.train": ("orion.serve", "orion.cli"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for path in ROOT.rglob("*.py"):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = path
    return out


def _imports(tree: ast.AST, modules: dict[str, Path], top_level_only: bool) -> set[str]:
    nodes = tree.body if top_level_only else list(ast.walk(tree))  # type: ignore[attr-defined]
    found: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            # `from pkg import submodule` depends on the submodule, not on pkg's body
            subs = [f"{node.module}.{a.name}" for a in node.names]
            found.update([s for s in subs if s in modules] or [node.module])
    return {m for m in found if m.startswith("orion")}


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_at_module_level():
    modules = _modules()
    edges = {m: _imports(ast.parse(p.read_text()), modules, True) - {m}
             for m, p in modules.items()}
    assert _cycles(edges) == []


@pytest.mark.parametrize("layer", sorted(FORBIDDEN))
def test_lower_layers_do_not_import_upper_ones(layer):
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if name == layer or name.startswith(layer + "."):
            for target in _imports(ast.parse(path.read_text()), modules, False):
                if target.startswith(FORBIDDEN[layer]):
                    bad.append(f"{name} imports {target}")
    assert bad == []


def test_the_checks_see_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
