"""The package map of docs/architecture.md, checked against the code's own imports.

Every import of an adaptspec module (at module level or inside a function) is read with
``ast``; the test fails on an import cycle between modules, on a package importing a package
of its own layer or above, on a top level that grows past five modules, on the two front doors
(vllm/, serving/) importing each other, on a cost model outside costs/, and on an import graph
taller than ``MAX_LAYERS``.
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
    {"errors", "paths"},  # the one exception; where the shipped files are (the bundled head)
    {"speculator", "_util"},
    {"costs", "schedules"},  # what a round or a pass costs (the one cost package); per-round schedules
    {"reward", "traces"},  # siblings: a trace set's rewards are reward's (trace_rewards), not the format's
    {"decoding"},
    {"models", "batching", "policies"},  # siblings: the policies read the bundled head's path from paths
    {
        "ab",
        "analysis",
        "load_rules",
        "host",
    },  # A/B variants and router; served-log analysis and its statistics; load rules; the host's measured costs
    {"collect", "simulators"},
    {"control", "fleet"},
    # the two front doors, siblings: the HTTP server, and adaptspec inside vLLM (only
    # vllm/scheduler.py imports vLLM; tests_vllm/ runs it); and the evaluation
    {"evaluation", "serving", "vllm"},
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


def test_vllm_and_serving_are_siblings():
    """The two front doors share what they both need from below (load_rules/, ab/, control/):
    neither imports the other."""
    bad = [
        f"{a} -> {b}"
        for a, targets in _edges(_modules()).items()
        for b in targets
        if {_unit(a), _unit(b)} == {"vllm", "serving"}
    ]
    assert bad == []


#: Modules outside costs/ that still model or measure what a round costs, each for a reason; no
#: other module outside costs/ may carry "cost" or "latency" in its name.
COSTS_ELSEWHERE = {
    "adaptspec.vllm.step_costs",  # reads the load rules' levels (load_rules/), which sit above costs/
    "adaptspec.host.costs",  # the host's record, measured by running the engine (above costs/)
    "adaptspec.batching.cost_surface",  # times the engine's own passes (above costs/)
}


def test_one_cost_package():
    named = {
        m
        for m in _modules()
        if _unit(m) not in ("costs", "cli")  # a command is named after what it does
        and any(w in m.rsplit(".", 1)[-1] for w in ("cost", "latency"))
    }
    assert named - COSTS_ELSEWHERE == set(), "a cost model belongs in adaptspec/costs/"
    assert COSTS_ELSEWHERE <= named, "moved into costs/? take it off COSTS_ELSEWHERE"


#: The height of the project's import graph (adaptspec's packages and top-level modules, and
#: benchmarks/ above them): at most this many layers, each standing above all it imports. The
#: target of issue 62, 10, is reached; lower this as packages come down, never raise it.
MAX_LAYERS = 10


def _layer_count() -> int:
    mods = _modules()
    up: dict[str, set[str]] = defaultdict(set)
    for a, targets in _edges(mods).items():
        up[_unit(a)].update(_unit(b) for b in targets if _unit(b) != _unit(a))
    for path in (PKG.parent / "benchmarks").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module in mods:
                up["benchmarks/"].add(_unit(node.module))
            elif isinstance(node, ast.Import):
                up["benchmarks/"].update(_unit(a.name) for a in node.names if a.name in mods)

    heights: dict[str, int] = {}

    def height(unit: str) -> int:  # the units' graph has no cycle (the layers above say so)
        if unit not in heights:
            heights[unit] = 1 + max((height(u) for u in up[unit]), default=0)
        return heights[unit]

    return max(height(u) for u in list(up))


def test_the_import_graph_is_at_most_max_layers_tall():
    layers = _layer_count()
    print(f"import graph: {layers} layers (at most {MAX_LAYERS})")
    assert layers <= MAX_LAYERS


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
