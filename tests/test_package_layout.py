"""The layout rules of the renovation, checked on the source: no import cycle among the modules of ordered_ssd and
csrc_bindings (imports inside functions included), no library file over 600 lines, and importing the library pulls
in nothing native."""
import ast
import os
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ("ordered_ssd", "csrc_bindings")
MAX_LINES = 600


def _modules():
    """``{module name: path}`` of every .py file of the packages."""
    mods = {}
    for pkg in PACKAGES:
        for dirpath, _, files in os.walk(os.path.join(ROOT, pkg)):
            for f in files:
                if f.endswith(".py"):
                    path = os.path.join(dirpath, f)
                    rel = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                    if rel[-1] == "__init__":
                        rel = rel[:-1]
                    mods[".".join(rel)] = path
    return mods


def _edges(name, path, mods):
    is_pkg = path.endswith("__init__.py")
    package = name if is_pkg else name.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(open(path).read(), path)):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    out.add(a.name)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            for a in node.names:
                sub = f"{target}.{a.name}"
                if sub in mods:
                    out.add(sub)
                elif target in mods:
                    out.add(target)
    out.discard(name)
    return out


def _cycles(graph):
    """Every cycle found by a depth-first search (as a list of module names)."""
    found, state = [], {}

    def visit(node, stack):
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append(stack[stack.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, stack)
        stack.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    return found


def test_the_graph_sees_real_imports():
    mods = _modules()
    graph = {m: _edges(m, p, mods) for m, p in mods.items()}
    assert "ordered_ssd.fold" in graph["ordered_ssd.ops.ssd_combined"]
    assert "ordered_ssd.ops.causal_conv1d" in graph["ordered_ssd.ops.ssd_split_conv1d"]
    assert "ordered_ssd.ops.ssd_combined" in graph["ordered_ssd.ops.ssd_split_conv1d"]
    assert "csrc_bindings" in graph["ordered_ssd.ops.linear"] or "csrc_bindings" in graph["ordered_ssd.ops.ssd_combined"]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]


def test_no_import_cycle():
    mods = _modules()
    graph = {m: _edges(m, p, mods) for m, p in mods.items()}
    assert _cycles(graph) == []


@pytest.mark.parametrize("pkg", PACKAGES)
def test_no_library_file_over_600_lines(pkg):
    long = {m: sum(1 for _ in open(p)) for m, p in _modules().items() if m.split(".")[0] == pkg}
    assert {m: n for m, n in long.items() if n > MAX_LINES} == {}


def test_import_pulls_in_nothing_native():
    code = ("import sys, ordered_ssd, ordered_ssd.ops, ordered_ssd.fold, ordered_ssd.reference, csrc_bindings; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('triton', 'mamba_ssm', 'causal_conv1d')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
