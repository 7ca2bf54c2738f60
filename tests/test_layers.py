"""No lower layer imports a higher one: store < sandbox < handlers < streams, replay < the CLI.

`grandrounds.sandbox` (the local FHIR test server) may use the store's helpers only; handlers may
start it. Run preparation (`handlers/environments/*run*`) lives below the CLI so that replay can use
it. Imports inside functions count too: a deferred import is still a dependency.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYER = {"store": 0, "sandbox": 1, "handlers": 2, "streams": 3, "replay": 3}
CLI = 4


def _layer_of_module(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] != "grandrounds":
        return None
    if len(parts) == 1:
        return CLI
    return LAYER.get(parts[1], CLI)


def _imports(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_no_module_imports_a_higher_layer():
    upward = []
    for top, layer in LAYER.items():
        for path in (ROOT / top).rglob("*.py"):
            for name in _imports(path):
                target = _layer_of_module(name)
                if target is not None and target > layer:
                    upward.append(f"{path.relative_to(ROOT)} imports {name}")
    assert upward == []
