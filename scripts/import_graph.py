"""The import graph of the grandrounds namespace, built from the source with ast (nothing is imported).

    python scripts/import_graph.py            # packages and who imports whom, cycles, largest modules
    python scripts/import_graph.py --json     # the same as one JSON object

tests/test_architecture.py uses the same functions to require no cycles and no upward imports, so the
graph printed here is the one the test checks. Every import counts, including those inside functions:
a deferred import hides a cycle from the interpreter, not from the reader.
"""

from __future__ import annotations

import ast
import json
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# The folders of the repository and the namespace each installs as (pyproject.toml package-dir).
SOURCE_DIRS = {
    "grandrounds": "grandrounds",
    "store": "grandrounds.store",
    "handlers": "grandrounds.handlers",
    "streams": "grandrounds.streams",
    "replay": "grandrounds.replay",
    "sandbox": "grandrounds.sandbox",
}

# Layers, lowest first: a module may import its own layer and those below it, never one above.
LAYERS = {
    "grandrounds.store": 0,
    "grandrounds.sandbox": 0.5,  # the local FHIR test server: the store's helpers only; handlers may start it
    "grandrounds.handlers": 1,
    "grandrounds.streams": 2,
    "grandrounds.replay": 2.5,  # re-executes runs through the streams' runners (embedded, Kafka): above them
    "grandrounds": 3,  # the CLI / composition root
}

# Inside handlers/, the packages that build on one another, lowest first (same rule as LAYERS). A package
# may import those below it; its other imports inside handlers/ (cases, text, tools, the stages) are not
# ordered here.
#   plugins       the entry-point registry machinery (backbones and environments register through it)
#   llm           the gateway, recorded exchanges, and what a case's failure is (CaseFailure)
#   environments  benchmark adapters: cases, tools, grading (MedAgentBench, AgentClinic)
#   agent         the agent loops (ReAct, FHIR, OSCE dialogue), acting through an environment's tools
#   policies      memory: what the agent is shown, what is learnt; reads the agent's replies
#   backbones     what the stages call to act and reflect: runs an agent loop (or the sim) with a policy's memory
HANDLER_LAYERS = {
    "grandrounds.handlers.plugins": 0,
    "grandrounds.handlers.llm": 1,
    "grandrounds.handlers.environments": 2,
    "grandrounds.handlers.agent": 3,
    "grandrounds.handlers.policies": 4,
    "grandrounds.handlers.backbones": 5,
}


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the namespace."""
    found: dict[str, Path] = {}
    for folder, package in SOURCE_DIRS.items():
        for path in sorted((root / folder).rglob("*.py")):
            rel = path.relative_to(root / folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            found[".".join([package, *parts])] = path
    return found


def _resolve(name: str, known: dict[str, Path]) -> str | None:
    """The longest known module that `name` names or lies in."""
    while name:
        if name in known:
            return name
        name = name.rpartition(".")[0]
    return None


def imports_of(module: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Modules of the namespace that `module` imports, anywhere in its body."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    is_package = path.name == "__init__.py"
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                target = _resolve(alias.name, known)
                if target:
                    out.add(target)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                base = base if is_package else base[:-1]
                base = base[: len(base) - (node.level - 1)]
                prefix = ".".join(base + ([node.module] if node.module else []))
            else:
                prefix = node.module or ""
            for alias in node.names:
                target = _resolve(f"{prefix}.{alias.name}", known) or _resolve(prefix, known)
                if target:
                    out.add(target)
    out.discard(module)
    return out


def module_graph(root: Path = ROOT) -> dict[str, set[str]]:
    known = modules(root)
    return {m: imports_of(m, p, known) for m, p in known.items()}


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:i]) for i in range(1, len(parts))}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative).

    A module importing its own package's __init__ is not counted: Python runs the package first, so
    that edge cannot form a cycle at import time.
    """
    edges = {m: sorted(t for t in ts if t not in _ancestors(m)) for m, ts in graph.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    out: list[list[str]] = []
    counter = 0
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(edges[start]))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = counter
                    counter += 1
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(edges.get(nxt, []))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == node:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return sorted(out)


def layer_of(module: str) -> str:
    parts = module.split(".")
    top = ".".join(parts[:2])
    return top if top in LAYERS else "grandrounds"


def handler_layer_of(module: str) -> str | None:
    """The `HANDLER_LAYERS` package a module is in (its own module: plugins), None outside them."""
    parts = module.split(".")
    top = ".".join(parts[:3])
    return top if top in HANDLER_LAYERS else None


def upward_handler_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs inside handlers/ where a package of `HANDLER_LAYERS` imports one above it."""
    bad = []
    for m, targets in graph.items():
        lm = handler_layer_of(m)
        if lm is None:
            continue
        for t in sorted(targets):
            lt = handler_layer_of(t)
            if lt is not None and HANDLER_LAYERS[lt] > HANDLER_LAYERS[lm]:
                bad.append((m, t))
    return sorted(bad)


def package_of(module: str, depth: int = 3) -> str:
    """The package a module belongs to, `depth` names deep (grandrounds.handlers.policies)."""
    known_packages = {m for m, p in modules().items() if p.name == "__init__.py"}
    parts = module.split(".")
    for cut in range(min(depth, len(parts)), 0, -1):
        cand = ".".join(parts[:cut])
        if cand in known_packages:
            return cand
    return parts[0]


def upward_imports(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """(importer, imported) pairs where a lower layer imports a higher one (two layers at the same level
    may not import each other either), and inside handlers/ a package importing one above it."""
    bad = []
    for m, targets in graph.items():
        lm = layer_of(m)
        for t in sorted(targets):
            lt = layer_of(t)
            if LAYERS[lt] > LAYERS[lm] or (LAYERS[lt] == LAYERS[lm] and lt != lm):
                bad.append((m, t))
    return sorted(set(bad) | set(upward_handler_imports(graph)))


def package_edges(graph: dict[str, set[str]], depth: int = 3) -> dict[str, dict[str, int]]:
    """Package -> {imported package: number of module-level edges}."""
    pkg = {m: package_of(m, depth) for m in graph}
    out: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for m, targets in graph.items():
        for t in targets:
            if pkg[m] != pkg[t]:
                out[pkg[m]][pkg[t]] += 1
    return {k: dict(sorted(v.items())) for k, v in sorted(out.items())}


def largest_modules(n: int = 15, root: Path = ROOT) -> list[tuple[str, int]]:
    sizes = [
        (str(p.relative_to(root)), sum(1 for _ in p.open(encoding="utf-8")))
        for p in modules(root).values()
    ]
    return sorted(sizes, key=lambda x: (-x[1], x[0]))[:n]


def main(argv: list[str]) -> int:
    graph = module_graph()
    report = {
        "modules": len(graph),
        "packages": package_edges(graph),
        "cycles": cycles(graph),
        "upward_imports": upward_imports(graph),
        "largest_modules": largest_modules(),
    }
    if "--json" in argv:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['modules']} modules")
    print("\npackages and who imports whom (number of module edges):")
    for p, targets in report["packages"].items():
        print(f"  {p}")
        for t, n in targets.items():
            print(f"      -> {t} ({n})")
    print(f"\nimport cycles: {len(report['cycles'])}")
    for c in report["cycles"]:
        print("  " + " <-> ".join(c))
    print(f"\nupward imports: {len(report['upward_imports'])}")
    for a, b in report["upward_imports"]:
        print(f"  {a} -> {b}")
    print("\nlargest modules (lines):")
    for path, n in report["largest_modules"]:
        print(f"  {n:6d}  {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
