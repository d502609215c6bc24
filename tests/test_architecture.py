"""The package map of docs/architecture.md, checked against the code's own imports.

Every import of an adaptspec module (at module level or inside a function) is read with
``ast``; the test fails on an import cycle between modules, on a package importing a package
of its own layer or above, and on a top level that grows past five modules.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import adaptspec

PKG = Path(adaptspec.__file__).parent

#: Bottom to top: a package may import packages of lower layers only (docs/architecture.md).
LAYERS = [
    {"errors"},
    {"speculator", "_util"},
    {"costs", "schedules"},  # what a round or a pass costs (the one cost package); per-round schedules
    {"reward"},
    {"traces"},
    {"decoding"},
    {"models", "batching"},
    {"policies"},
    {
        "analysis",
        "load_rules",
        "host",
    },  # served-log analysis and its statistics (which the A/B simulation uses); load rules; the host's measured costs
    {"collect", "simulators"},
    {"control", "fleet"},
    {"evaluation", "serving"},
    {"vllm"},  # adaptspec inside vLLM (only vllm/scheduler.py imports vLLM; tests_vllm/ runs it)
    {"cli"},
]
FACADE = {"adaptspec", "adaptspec.__main__"}  # the lazy public names and `python -m adaptspec`
LAYER_OF = {name: i for i, layer in enumerate(LAYERS) for name in layer}


def _modules() -> dict[str, tuple[Path, bool]]:
    mods = {}
    for p in PKG.rglob("*.py"):
        parts = list(p.relative_to(PKG.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        mods[".".join(parts[:-1] if is_pkg else parts)] = (p, is_pkg)
    return mods


def _edges(mods) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = defaultdict(set)
    for mod, (path, is_pkg) in mods.items():
        base = mod if is_pkg else mod.rsplit(".", 1)[0]
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                parts = base.split(".")
                parts = parts[: len(parts) - node.level + 1] if node.level else []
                target = ".".join(parts + [node.module]) if node.module else ".".join(parts)
                if not target.startswith("adaptspec"):
                    continue
                subs = [f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in mods]
                for t in subs or ([target] if target in mods else []):
                    if t != mod:
                        edges[mod].add(t)
            elif isinstance(node, ast.Import):
                edges[mod].update(a.name for a in node.names if a.name in mods and a.name != mod)
    return edges


def _unit(mod: str) -> str:
    """The layered unit a module belongs to: its package under adaptspec, or its own name at the top."""
    return mod.split(".")[1] if mod.count(".") >= 1 else mod


def _cycles(edges) -> list[list[str]]:
    index, low, stack, on, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles():
    assert _cycles(_edges(_modules())) == []


def test_every_package_has_a_layer_and_imports_only_lower_layers():
    mods = _modules()
    units = {_unit(m) for m in mods if m not in FACADE}
    assert units <= set(LAYER_OF), (
        f"packages without a layer in docs/architecture.md: {sorted(units - set(LAYER_OF))}"
    )
    bad = []
    for a, targets in _edges(mods).items():
        if a in FACADE:
            continue
        for b in targets:
            ua, ub = _unit(a), _unit(b)
            if b in FACADE or (ua != ub and LAYER_OF[ub] >= LAYER_OF[ua]):
                bad.append(f"{a} -> {b}")
    assert bad == []


def test_top_level_holds_at_most_five_modules():
    top = sorted(p.name for p in PKG.glob("*.py"))
    assert len(top) <= 5, top


def test_import_adaptspec_is_cheap_and_public_names_resolve():
    code = (
        "import sys, adaptspec; assert 'torch' not in sys.modules, 'import adaptspec pulled torch'; "
        "from adaptspec import AdaptiveController, AdaptspecError, BlockSpeculator, Decision, Outcome, Prefill, Round; "
        "from adaptspec.control import AdaptiveController as A; assert A is AdaptiveController"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
