"""The distribution installs one import namespace, `grandrounds`, and nothing imports the old names.

The repository keeps streams/, handlers/, store/ and replay/ at the top (the design card), and
pyproject.toml maps them to grandrounds.streams, grandrounds.handlers, ...: a wheel that put a
generic `store` or `handlers` into site-packages would collide with any other distribution.
"""

from __future__ import annotations

import ast
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MAPPED = {"grandrounds": "grandrounds", "store": "grandrounds.store", "handlers": "grandrounds.handlers",
          "streams": "grandrounds.streams", "replay": "grandrounds.replay", "sandbox": "grandrounds.sandbox"}
OLD_TOP_LEVEL = {"store", "handlers", "streams", "replay"}


def _source_packages() -> set[str]:
    found = set()
    for top, ns in MAPPED.items():
        for init in (ROOT / top).rglob("__init__.py"):
            rel = init.parent.relative_to(ROOT / top)
            found.add(ns if rel == Path(".") else ns + "." + ".".join(rel.parts))
    return found


def _python_files() -> list[Path]:
    files = []
    for top in [*MAPPED, "tests", "benchmarks"]:
        files += [p for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts]
    return files


@pytest.mark.slow
def test_wheel_installs_grandrounds_alone(tmp_path):
    out = tmp_path / "dist"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(out), str(ROOT)], check=True, cwd=tmp_path, timeout=300)
    wheel, = out.glob("grandrounds-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"grandrounds"}, sorted(tops)
    in_wheel = {n.rsplit("/", 1)[0].replace("/", ".") for n in names if n.endswith("/__init__.py")}
    assert in_wheel == _source_packages(), "a subpackage is missing from [tool.setuptools] packages"
    assert any(n.startswith("grandrounds/handlers/policies/presets/") and n.endswith(".toml") for n in names)


def test_no_module_imports_an_old_top_level_name():
    offenders = []
    for path in _python_files():
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            offenders += [f"{path.relative_to(ROOT)}:{node.lineno} {n}" for n in names
                          if n.split(".", 1)[0] in OLD_TOP_LEVEL]
    assert not offenders, offenders


def test_every_source_package_is_listed_in_pyproject():
    import tomllib
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    assert listed == _source_packages()


def _declared() -> dict[str, str]:
    """Declared runtime dependency name (normalised) -> its version specifier."""
    import re
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    # runtime dependencies, and the extras (an optional part, e.g. the local model's server, declares its own)
    deps = project["dependencies"] + [d for group in project.get("optional-dependencies", {}).values() for d in group]
    out = {}
    for d in deps:
        m = re.match(r"([A-Za-z0-9_.-]+)(\[[^\]]*\])?(.*)", d)
        out[m.group(1).lower().replace("_", "-")] = m.group(3)
    return out


def test_every_imported_distribution_is_declared_with_a_tested_range():
    import importlib.metadata as md

    declared = _declared()
    dists = md.packages_distributions()
    missing = set()
    for top in MAPPED:  # the installed code only: tests and benchmarks may use test extras
        for path in (ROOT / top).rglob("*.py"):
            tree = ast.parse(path.read_text(), str(path))
            # `try: import a` with an ImportError fallback: `a` is optional, the fallback is checked
            optional = {id(n) for t in ast.walk(tree) if isinstance(t, ast.Try)
                        and any(isinstance(h.type, ast.Name) and h.type.id in ("ImportError", "ModuleNotFoundError")
                                for h in t.handlers)
                        for stmt in t.body for n in ast.walk(stmt)}
            for node in ast.walk(tree):
                if id(node) in optional:
                    continue
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                    [node.module] if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module else []
                for name in names:
                    head = name.split(".")[0]
                    if head in sys.stdlib_module_names or head == "grandrounds" or head in OLD_TOP_LEVEL:
                        continue
                    owners = {d.lower().replace("_", "-") for d in dists.get(head, [head])}
                    # a distribution pulled in by a declared one (torch by sentence-transformers) must still
                    # be declared if we import it: nothing promises its API otherwise
                    if not owners & set(declared):
                        missing.add(f"{head} ({path.relative_to(ROOT)})")
    assert not missing, sorted(missing)
    unbounded = [f"{n}{spec}" for n, spec in declared.items()
                 if ("==" not in spec) and (">=" not in spec or "<" not in spec.replace("<=", ""))]
    assert unbounded == [], "every dependency needs a lower and an upper bound"
